"""The S3 backend (aiobotocore): client, errors and retries, multipart upload, ranged download."""
