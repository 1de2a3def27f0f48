"""fsspec options for the moto S3 server of the `s3_server` fixture (tests/fixtures/s3.py)."""

from __future__ import annotations


def s3_options(endpoint: str) -> dict:
    # No region_name: with it, moto refuses bucket creation (InvalidLocationConstraint).
    return {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": endpoint}}
