"""blob_svc: content-addressed mail content on S3 (MinIO), streamed in chunks."""
