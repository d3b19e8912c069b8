"""The backends behind the ports: Cassandra (the view, small blobs), RabbitMQ (the broker), S3
(mail content), the blob_svc client, gRPC channel options."""
