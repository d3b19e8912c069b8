"""The interfaces the use-cases need from the outside: the broker (publish, consume, topology) and the blob store."""
