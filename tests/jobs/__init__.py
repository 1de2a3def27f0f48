"""Batch jobs: planning, inputs and outputs (Parquet, JSON Lines, CSV, Lance, S3), resume, reindex, run, eval."""
