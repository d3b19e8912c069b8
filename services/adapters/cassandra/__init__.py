"""The Cassandra time-series view of the queues (ADR-31): schema, one DAO per table, configuration; small blobs."""
