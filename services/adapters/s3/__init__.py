"""Mail content on S3 (MinIO): a small signing client, its error mapping, the blob store."""
