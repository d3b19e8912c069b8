module mailqueue.local/nettest

go 1.24
