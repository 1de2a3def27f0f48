"""Batch jobs: planning, submitting and following them, manifests, resume, reindex, the run lock."""
