"""The S3 store (aiobotocore): its primitives, client, errors and retries, conditional writes,
multipart upload, ranged download."""
