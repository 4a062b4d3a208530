"""Model locations (tiny://, paths, hf://, s3://) resolved to local Hugging Face folders; the tiny models."""
