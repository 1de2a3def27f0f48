#!/usr/bin/env python
"""Long documents: truncation against chunking, quality and cost, side by side in one run.

* corpus: datasets/pydoc-sections with each topic's passages joined into one
  document (68 "reference pages", the shape the issue describes); queries are
  the set's section headings, and a document is relevant when it holds a
  judged passage.
* model: all-MiniLM-L6-v2 (catalog `minilm`, window 256 tokens) through the
  worker's own runtime (`SentenceEmbedder`, token-budget batching), one process.
* truncated: one vector per document, cut at 256 tokens (Shoal without --chunk).
* chunked: `token_windows` with ``--tokens``/``--overlap`` (Shoal's --chunk),
  every window embedded, documents ranked by their best window
  (`retrieval.top_k_documents`, as `shoal run` does).
* timing: the two embeddings alternate ``--rounds`` times; each one's best time
  is kept and the ratio of medians reported. The other processes' share of the
  machine is recorded: this machine may be shared.

    .venv/bin/python benchmarks/long_documents.py
    .venv/bin/python benchmarks/long_documents.py --tokens 128 --overlap 16
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import harness  # before Shoal's imports: the repository on sys.path, the workers' environment defaults
import numpy as np
import pyarrow.parquet as pq
from harness import ROOT, Meter

from shoal.configs import load_catalog
from shoal.pipeline.retrieval.evaluation import evaluate
from shoal.pipeline.retrieval.top_k import Vectors, top_k, top_k_documents
from shoal.workers.data.chunking import ChunkSettings, token_windows

DATA = ROOT / "datasets" / "pydoc-sections"


def topic_documents() -> tuple[list[str], list[str], list[str], list[str], dict[str, dict[str, int]]]:
    """(document ids, texts, query ids, query texts, qrels at document level)."""
    corpus = pq.read_table(DATA / "corpus.parquet").to_pylist()
    by_topic: dict[str, list[str]] = {}
    topic_of = {}
    for row in corpus:
        by_topic.setdefault(row["topic"], []).append(row["text"])
        topic_of[row["id"]] = row["topic"]
    queries = pq.read_table(DATA / "queries.parquet").to_pylist()
    qrels: dict[str, dict[str, int]] = {}
    for row in pq.read_table(DATA / "qrels.parquet").to_pylist():
        qrels.setdefault(row["query_id"], {})[topic_of[row["corpus_id"]]] = 1
    return (
        list(by_topic),
        [" ".join(p) for p in by_topic.values()],
        [q["id"] for q in queries],
        [q["text"] for q in queries],
        qrels,
    )


def figures(result: dict) -> list[harness.Figure]:
    """Chunking against truncation: retrieval quality and the time it costs."""
    quality = result["quality"]
    return [
        harness.Figure(
            "nDCG@10 chunked / truncated",
            f"{quality['chunked']['ndcg@10']:.3f} / {quality['truncated']['ndcg@10']:.3f}",
        ),
        harness.Figure("chunked / truncated time", result["chunked_over_truncated_time"], "x"),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--overlap", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=str(harness.result_path("long_documents")))
    args = parser.parse_args()

    import torch

    from shoal.workers.devices import DevicePlan
    from shoal.workers.runtimes.embedder import SentenceEmbedder

    torch.set_num_threads(harness.usable_cores())
    spec = load_catalog().get("minilm")
    runtime = SentenceEmbedder(spec, DevicePlan("cpu", "cpu", "float32", 10**10))
    doc_ids, docs, query_ids, queries, qrels = topic_documents()
    settings = ChunkSettings(tokens=args.tokens, overlap=args.overlap)
    windowing = []
    for _ in range(args.rounds):  # the split alone, as a worker runs it before embedding
        began = time.perf_counter()
        windows = token_windows(runtime.tokenizer, docs, settings)
        windowing.append(time.perf_counter() - began)
    doc_tokens = [len(ids) for ids in runtime.tokenizer(docs, add_special_tokens=False, verbose=False)["input_ids"]]
    runtime.embed(docs[:4])  # warm-up

    times: dict[str, list[float]] = {"truncated": [], "chunked": []}
    others: list[float] = []
    vectors: dict[str, np.ndarray] = {}
    for round_ in range(args.rounds):
        order = ["truncated", "chunked"] if round_ % 2 == 0 else ["chunked", "truncated"]
        for name in order:
            texts = docs if name == "truncated" else windows.texts
            with Meter() as meter:
                vectors[name], _ = runtime.embed(texts)
            times[name].append(meter.seconds)
            if meter.other_share is not None:
                others.append(meter.other_share)

    query_vectors, _ = runtime.embed(queries)
    nearest, _ = top_k(query_vectors, vectors["truncated"], 10)
    truncated = evaluate({q: [doc_ids[i] for i in row] for q, row in zip(query_ids, nearest)}, qrels, recall_k=10)
    chunk_ids = [doc_ids[s] for s in windows.source]
    documents, nearest, _ = top_k_documents(query_vectors, Vectors(chunk_ids, vectors["chunked"], 0), 10)
    chunked = evaluate({q: [documents[i] for i in row] for q, row in zip(query_ids, nearest)}, qrels, recall_k=10)

    window_content = args.tokens - runtime.tokenizer.num_special_tokens_to_add(pair=False)
    result = {
        "conditions": harness.conditions(
            torch_threads=torch.get_num_threads(), other_share_max=max(others, default=None)
        ),
        "documents": len(docs),
        "queries": len(queries),
        "doc_tokens": {"median": int(statistics.median(doc_tokens)), "max": max(doc_tokens), "total": sum(doc_tokens)},
        "chunk": {"tokens": args.tokens, "overlap": args.overlap, "windows": len(windows.texts)},
        "tokens_embedded": {
            "truncated": int(sum(min(n, window_content) for n in doc_tokens)),
            "chunked": int(
                sum(
                    len(ids)
                    for ids in runtime.tokenizer(windows.texts, add_special_tokens=False, verbose=False)["input_ids"]
                )
            ),
        },
        "seconds_best": {
            **{name: round(min(t), 3) for name, t in times.items()},
            "windowing": round(min(windowing), 4),
        },
        "chunked_over_truncated_time": round(
            statistics.median(times["chunked"]) / statistics.median(times["truncated"]), 2
        ),
        "quality": {"truncated": truncated, "chunked": chunked},
    }
    harness.write_result("long_documents", result, args.json, figures(result))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
