#!/usr/bin/env python
"""Compact vectors: bytes per vector against retrieval quality, for every --precision and a few --dim.

* data: datasets/pydoc-sections (431 passages, 167 judged queries), BEIR metrics
  (`shoal.pipeline.retrieval.evaluation`, nDCG@10 and recall@10).
* model: all-MiniLM-L6-v2 (catalog `minilm`, 384 dims) through the worker's
  runtime; corpus and queries are stored the way `shoal embed --precision P
  --dim D` stores them (`shoal.workers.data.vector_precision.compact`, int8/uint8 ranges
  from the corpus, as a job calibrates them on its first item), and scored as
  a vector store would: dot products of the stored values (binary/ubinary
  unpacked to +-1, the same order as Hamming distance).
* all-MiniLM-L6-v2 was not trained for Matryoshka truncation, so --dim rows
  show what cutting costs a model that was not; a Matryoshka model keeps more.

    .venv/bin/python benchmarks/compact_vectors.py
"""

from __future__ import annotations

import argparse
import sys

import harness  # before Shoal's imports: the repository on sys.path, the workers' environment defaults
import numpy as np
import pyarrow.parquet as pq
from harness import ROOT

from shoal.configs import load_catalog
from shoal.pipeline.retrieval.evaluation import evaluate
from shoal.workers.data.vector_precision import PRECISIONS, VectorFormat, compact, ranges_of

DATA = ROOT / "datasets" / "pydoc-sections"
DIMS = (None, 256, 128)


def scores(queries: np.ndarray, corpus: np.ndarray, precision: str) -> np.ndarray:
    if precision in ("binary", "ubinary"):

        def signs(packed: np.ndarray) -> np.ndarray:
            bits = np.unpackbits(
                packed.view(np.uint8) if precision == "ubinary" else (packed.astype(np.int16) + 128).astype(np.uint8),
                axis=1,
            )
            return bits.astype(np.float32) * 2 - 1

        return signs(queries) @ signs(corpus).T
    return queries.astype(np.float32) @ corpus.astype(np.float32).T


def figures(result: dict) -> list[harness.Figure]:
    """nDCG@10 of each compact format at full dimension against float32's."""
    rows = result["rows"]
    full = [row for row in rows if row["dim"] == max(r["dim"] for r in rows)]
    return [
        harness.Figure(f"nDCG@10, {row['precision']} ({row['bytes_per_vector']} bytes)", round(row["ndcg@10"], 4))
        for row in full
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", default=str(harness.result_path("compact_vectors")))
    args = parser.parse_args()

    from shoal.workers.devices import DevicePlan
    from shoal.workers.runtimes.embedder import SentenceEmbedder

    runtime = SentenceEmbedder(load_catalog().get("minilm"), DevicePlan("cpu", "cpu", "float32", 10**10))
    corpus = pq.read_table(DATA / "corpus.parquet").to_pylist()
    queries = pq.read_table(DATA / "queries.parquet").to_pylist()
    qrels: dict[str, dict[str, int]] = {}
    for row in pq.read_table(DATA / "qrels.parquet").to_pylist():
        qrels.setdefault(row["query_id"], {})[row["corpus_id"]] = row["score"]
    corpus_vectors, _ = runtime.embed([r["text"] for r in corpus])
    query_vectors, _ = runtime.embed([q["text"] for q in queries])

    rows = []
    for dim in DIMS:
        for precision in PRECISIONS:
            fmt = VectorFormat(precision=precision, dim=dim)
            if fmt.needs_ranges:
                fmt = VectorFormat(precision=precision, dim=dim, ranges=ranges_of(corpus_vectors, dim))
            stored_corpus, stored_queries = compact(corpus_vectors, fmt), compact(query_vectors, fmt)
            order = np.argsort(-scores(stored_queries, stored_corpus, precision), axis=1, kind="stable")[:, :10]
            rankings = {q["id"]: [corpus[i]["id"] for i in row] for q, row in zip(queries, order)}
            rows.append(
                {
                    "precision": precision,
                    "dim": dim or corpus_vectors.shape[1],
                    "bytes_per_vector": int(stored_corpus[0].nbytes),
                    **evaluate(rankings, qrels, recall_k=10),
                }
            )
    harness.write_result("compact_vectors", {"rows": rows}, args.json, figures({"rows": rows}))
    for row in rows:
        print(
            f"{row['precision']:>8} dim {row['dim']:>3}: {row['bytes_per_vector']:>5} B  nDCG@10 {row['ndcg@10']:.3f}  recall@10 {row['recall@10']:.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
