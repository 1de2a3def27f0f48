"""Images/s of a whole `shoal embed` over a folder of JPEGs against a direct sentence-transformers script.

Both sides are whole processes started the same way, run in turn (each goes
first in alternate rounds), on the same files:

- direct: list the files, then per chunk of 256 decode them with Pillow
  (``Image.open(...).convert("RGB")``) and call ``SentenceTransformer.encode``
  (batch size 32): what a user writes without Shoal;
- shoal: ``shoal embed FOLDER OUTPUT --model FOLDER`` with no other flag: the
  image files planned as items, read and decoded on the workers a batch ahead
  of the device (off the device thread), the runtime `auto` chooses. As after
  a first use: before the timed rounds, one untimed job over a few of the
  images with ``SHOAL_AUTO_MEASURE=wait`` exports the model's towers and
  measures its runtimes (auto's verdict, cached in the scratch folder's own
  Shoal cache); the timed jobs run what that verdict chose, named in the
  result (``shoal_runtime``).

The model: no CLIP weights are on this machine and nothing is downloaded, so a
CLIP of ViT-B/32's shape (transformers' `CLIPConfig` defaults: a 12-layer ViT
of width 768 on 224-pixel inputs in 32-pixel patches, a 12-layer text tower
of width 512, 512-wide projections; random weights) is built locally and
saved as a sentence-transformers folder; its tokenizer is CLIP's byte-level
one without merges. The JPEGs are drawn: 640x480 (the size of a phone photo
scaled for the web), smooth colour fields with shapes and grain, quality 90.
The vectors of both sides are compared (cosine), so the speed is of the same
work.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import harness  # noqa: F401  (sys.path, environment)
import numpy as np
import pyarrow.parquet as pq
from harness import ROOT, Meter

DEFAULT_JSON = str(harness.result_path("image_embed"))

DIRECT = """
import sys, glob, os, numpy as np
from PIL import Image
from sentence_transformers import SentenceTransformer
folder, out = sys.argv[2], sys.argv[3]
paths = sorted(glob.glob(os.path.join(folder, "*.jpg")))
model = SentenceTransformer(sys.argv[1], device="cpu", local_files_only=True)
vectors = []
for start in range(0, len(paths), 256):
    images = [Image.open(p).convert("RGB") for p in paths[start:start + 256]]
    vectors.append(model.encode(images, batch_size=32))
np.save(out, np.concatenate(vectors))
"""


def build_clip(folder: Path) -> Path:
    """A ViT-B/32-shaped CLIP with random weights, as a sentence-transformers folder."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Transformer
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    from tests.support.image_models import _byte_level_vocab

    backbone = folder / "backbone"
    backbone.mkdir(parents=True, exist_ok=True)
    vocab = _byte_level_vocab()
    (backbone / "vocab.json").write_text(json.dumps(vocab))
    (backbone / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = CLIPTokenizer(
        vocab=str(backbone / "vocab.json"), merges=str(backbone / "merges.txt"), model_max_length=77
    )
    start, end = vocab["<|startoftext|>"], vocab["<|endoftext|>"]
    config = CLIPConfig(
        text_config={"vocab_size": len(vocab), "bos_token_id": start, "eos_token_id": end, "pad_token_id": end},
        vision_config={"patch_size": 32},
    )
    torch.manual_seed(0)
    CLIPModel(config).save_pretrained(backbone)
    CLIPProcessor(image_processor=CLIPImageProcessor(), tokenizer=tokenizer).save_pretrained(backbone)
    model = SentenceTransformer(modules=[Transformer(str(backbone), max_seq_length=77)], device="cpu")
    out = folder / "clip-vit-b-32-shaped"
    model.save(str(out))
    shutil.rmtree(backbone)
    return out


def draw_jpegs(folder: Path, count: int) -> list[str]:
    """`count` 640x480 JPEGs: smooth colour fields (a small random image scaled up), shapes, grain."""
    from PIL import Image, ImageDraw

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    names = []
    for i in range(count):
        field = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize(
            (640, 480), Image.Resampling.BICUBIC
        )
        draw = ImageDraw.Draw(field)
        for _ in range(4):
            x, y, w, h = (int(v) for v in rng.integers([0, 0, 20, 20], [560, 400, 200, 200]))
            draw.ellipse([x, y, x + w, y + h], fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
        grain = rng.normal(0, 12, (480, 640, 3))
        pixels = np.clip(np.asarray(field, dtype=np.float32) + grain, 0, 255).astype(np.uint8)
        name = f"{i:05d}.jpg"
        Image.fromarray(pixels).save(folder / name, quality=90)
        names.append(name)
    return names


def timed(command: list[str], env: dict[str, str]) -> tuple[float, str]:
    with Meter() as meter:
        done = subprocess.run(command, capture_output=True, text=True, env=harness.subprocess_env(**env))
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:3])} failed:\n{done.stderr[-3000:]}")
    return meter.seconds, done.stdout + done.stderr


def runtime_row(summary: str) -> str:
    """The job summary's "runtime of MODEL on WORKER" value: what the worker ran the model on, and why."""
    rows = [m for m in map(harness.SUMMARY_ROW.match, summary.splitlines()) if m]
    found = [m.group("value") for m in rows if m.group("key").startswith("runtime of")]
    return found[0] if found else "(no runtime row in the summary)"


def shoal_vectors(output: Path, names: list[str]) -> np.ndarray:
    table = pq.read_table(output, columns=["id", "embedding"])
    by_id = dict(zip(table.column("id").to_pylist(), table.column("embedding").to_pylist()))
    return np.array([by_id[name] for name in names], dtype=np.float32)


def figures(result: dict) -> list[harness.Figure]:
    """Images/s of `shoal embed` over a direct Pillow + encode script (goal 1.5x), and their vectors' agreement."""
    ratio = result["shoal_vs_direct"]
    return [
        harness.Figure(f"shoal embed / direct, {result['images']} images", ratio, "x", ">= 1.5x", ratio >= 1.5),
        harness.Figure("cosine to the direct vectors, min", result["cosine_min"]),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2, help="runs of each side, alternating which goes first")
    parser.add_argument("--scratch", default=str(ROOT / "out" / "bench-image-embed"))
    parser.add_argument("--json", default=DEFAULT_JSON)
    args = parser.parse_args()
    scratch = Path(args.scratch)
    model_folder = scratch / "model" / "clip-vit-b-32-shaped"
    model = model_folder if model_folder.is_dir() else build_clip(scratch / "model")
    images = scratch / "images"
    names = sorted(p.name for p in images.glob("*.jpg")) if images.is_dir() else []
    if len(names) != args.images:
        shutil.rmtree(images, ignore_errors=True)
        names = draw_jpegs(images, args.images)
    (scratch / "direct.py").write_text(DIRECT)
    env = {"SHOAL_CACHE_DIR": str(scratch / "cache")}  # this run's own exports and verdicts
    first_use = scratch / "first-use"
    shutil.rmtree(first_use, ignore_errors=True)
    first_use.mkdir(parents=True)
    for name in names[:16]:
        shutil.copyfile(images / name, first_use / name)
    seconds, output = timed(
        [harness.venv_command("shoal"), "embed", str(first_use), str(scratch / "first-use-out"), "--model", str(model)],
        {**env, "SHOAL_AUTO_MEASURE": "wait"},
    )
    shutil.rmtree(scratch / "first-use-out", ignore_errors=True)
    print(f"first use (export and auto's measurement, untimed): {seconds:.1f} s; {runtime_row(output)}", flush=True)
    direct_out, shoal_out = scratch / "direct.npy", scratch / "shoal-out"
    commands = {
        "direct": [sys.executable, str(scratch / "direct.py"), str(model), str(images), str(direct_out)],
        "shoal": [harness.venv_command("shoal"), "embed", str(images), str(shoal_out), "--model", str(model)],
    }
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in commands}
    summary = ""
    for r in range(args.rounds):
        for name in list(commands)[r % 2 :] + list(commands)[: r % 2]:  # each side goes first in turn
            if name == "shoal":  # a fresh output, not a resumed one
                shutil.rmtree(shoal_out, ignore_errors=True)
            load = harness.load_average()
            seconds, output = timed(commands[name], env)
            if name == "shoal":
                summary = output
            runs[name].append({"seconds": round(seconds, 2), "load_before": round(load, 2)})
            print(f"round {r + 1} {name}: {seconds:.1f} s ({len(names) / seconds:.1f} images/s)", flush=True)
    best = {name: min(run["seconds"] for run in rs) for name, rs in runs.items()}
    direct, ours = np.load(direct_out), shoal_vectors(shoal_out, names)
    cosine = (direct * ours).sum(1) / np.linalg.norm(direct, axis=1) / np.linalg.norm(ours, axis=1)
    result = {
        "model": "CLIP of ViT-B/32's shape (transformers CLIPConfig defaults, patch 32, 224 px), random weights, "
        "as a sentence-transformers folder (built locally: no CLIP weights on this machine)",
        "images": len(names),
        "image_size": "640x480 JPEG, quality 90",
        "rounds": args.rounds,
        "direct_best_s": best["direct"],
        "shoal_best_s": best["shoal"],
        "direct_images_per_s": round(len(names) / best["direct"], 1),
        "shoal_images_per_s": round(len(names) / best["shoal"], 1),
        "shoal_vs_direct": round(best["direct"] / best["shoal"], 2),
        "cosine_min": round(float(cosine.min()), 6),
        "cosine_mean": round(float(cosine.mean()), 6),
        "shoal_runtime": runtime_row(summary),
        "shoal_summary": summary[-2000:],
        "runs": runs,
        "conditions": harness.conditions(),
    }
    harness.write_result("image_embed", result, args.json, figures(result))
    print(json.dumps({k: v for k, v in result.items() if k not in ("runs", "conditions", "shoal_summary")}, indent=1))


if __name__ == "__main__":
    main()
