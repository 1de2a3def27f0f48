"""Retrieval: `shoal run` (embed, top-k, rerank) and `shoal eval` on BEIR-format sets."""
