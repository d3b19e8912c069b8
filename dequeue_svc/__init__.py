"""dequeue_svc: consumers receive mails on a bidirectional stream and answer each one."""
