"""The image kind on ONNX Runtime: `auto` measures its runtimes as it does a text embedder's, and a job and an
online request run on it.

The runtime's vectors against the reference libraries are test_image_runtime.py's (both runtimes, every
layout). Here: `auto`'s measurement of a tiny CLIP, its speeds driven (no timing in a test), through the real
quality gate (drawn images and texts) to its verdict, and the worker's choice from that verdict; then `shoal
embed` and `shoal serve` with the model pinned to ONNX, their vectors the reference library's.
"""

from __future__ import annotations

import io
import subprocess
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from shoal.configs import ModelSpec, RuntimeChoice, load_profile
from shoal.configs.fingerprints import model_fingerprint
from shoal.configs.kinds import kind_of
from shoal.configs.machine import probe
from shoal.configs.verdicts import choose, verdict_path, write_record
from shoal.pipeline.client import OnlineClient
from shoal.pipeline.tuning import auto_runtime
from shoal.workers.devices import DevicePlan
from shoal.workers.runtime_choice import MEASURE_ENV, RuntimeChooser
from tests.support.cli import embed_args, run_shoal
from tests.support.files import write_profile
from tests.support.image_models import CLIP_DIM, TEXT_WINDOW, draw_images, encoded
from tests.support.paths import SHOAL
from tests.support.processes import started, wait_for_line

pytestmark = pytest.mark.integration

ONNX = RuntimeChoice(runtime="onnx", dtype="float32")
PLAN = DevicePlan("cpu", "cpu", "float32", 10**9, 1)


def clip_spec(folder: Path) -> ModelSpec:
    return ModelSpec(
        name="clip",
        kind="image_embedder",
        source=str(folder),
        dim=CLIP_DIM,
        max_seq_length=TEXT_WINDOW,
        normalize=True,
        image_batch={"cpu": 8},
    )


def reference(folder: Path, images: list[bytes], texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Normalised get_image_features and get_text_features of a transformers CLIP folder."""
    import torch
    from PIL import Image
    from transformers import AutoModel, AutoProcessor

    model = AutoModel.from_pretrained(folder).eval()
    processor = AutoProcessor.from_pretrained(folder)
    with torch.inference_mode():
        pixels = processor(images=[Image.open(io.BytesIO(d)) for d in images], return_tensors="pt")
        image_vectors = model.get_image_features(**pixels).pooler_output
        tokens = processor(text=texts, return_tensors="pt", padding=True, truncation=True, max_length=TEXT_WINDOW)
        text_vectors = model.get_text_features(**tokens).pooler_output
    normalize = torch.nn.functional.normalize
    return normalize(image_vectors, dim=-1).numpy(), normalize(text_vectors, dim=-1).numpy()


def close(got, expected) -> None:
    got = np.asarray(got, dtype=np.float32)
    cosine = (got * expected).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)
    assert cosine.min() >= 0.9999
    np.testing.assert_allclose(got, expected, atol=1e-4)


@pytest.mark.parametrize("onnx_speed, chosen", [(2.0, "onnx"), (0.8, "torch")])
def test_auto_measures_the_image_kind_and_runs_onnx_where_it_measures_faster(
    clip_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, onnx_speed: float, chosen: str
) -> None:
    """The speeds are driven; the loads, the export, the gate (drawn images, then texts) and the choice are real."""
    from shoal.pipeline.tuning import runtimes

    monkeypatch.setenv("SHOAL_CACHE_DIR", str(tmp_path))
    spec, machine, profile = clip_spec(clip_folder), probe(), load_profile("cpu-local")
    assert kind_of(spec).measured
    offered = auto_runtime.offered("cpu", machine)
    assert ("onnx", "float32") in {(c.runtime, c.dtype) for c in offered}
    timed: list[list[str]] = []

    def driven(candidates, reference_runtime, texts, pairs, work, bars):
        timed.append([type(runtime).__name__ for runtime in [reference_runtime, *candidates]])
        assert work is kind_of(spec).gate.outputs  # timed on what the gate compares: images, then texts
        return [onnx_speed if c == ONNX else 0.5 for c in offered]

    monkeypatch.setattr(runtimes, "speedups", driven)
    record = auto_runtime.measure(spec, profile, machine)

    assert timed == [
        ["ImageEmbedder", *("OnnxImageEmbedder" if c.runtime == "onnx" else "ImageEmbedder" for c in offered)]
    ]
    rows = {(row["runtime"], row["dtype"]): row for row in record["candidates"]}
    choice, why = choose(record)
    assert (choice.runtime, choice.dtype) == (chosen, "float32")
    if chosen == "onnx":  # gated on images and texts against fp32 torch: float reordering only
        assert rows["onnx", "float32"]["verdict"] == "pass", why
        assert rows["onnx", "float32"]["figures"]["cosine_min"] >= 0.9999
    else:
        assert rows["onnx", "float32"]["verdict"] == "too slow"

    # The worker's choice from that record: what its pool loads the model on.
    path = verdict_path(model_fingerprint(spec), machine, PLAN.threads, "cpu")
    write_record(path, record)
    monkeypatch.setenv(MEASURE_ENV, "wait")
    chooser = RuntimeChooser(profile, PLAN, machine)
    loaded = chooser.choose(spec)
    assert loaded.runtimes.get("cpu", RuntimeChoice()).runtime == chosen
    assert chooser.report()["clip"].startswith(f"{chosen} float32")


def test_a_job_and_an_online_request_run_on_onnx(clip_folder: Path, tmp_path: Path) -> None:
    images = [encoded(p, "PNG" if i % 3 == 0 else "JPEG") for i, p in enumerate(draw_images(12, seed=21))]
    texts = ["a red cat", "a blue boat on a long winding river"]
    expected_images, expected_texts = reference(clip_folder, images, texts)
    folder = tmp_path / "images"
    folder.mkdir()
    for i, data in enumerate(images):
        (folder / f"{i:02d}.{'png' if i % 3 == 0 else 'jpg'}").write_bytes(data)
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"models": {"clip": {"source": str(clip_folder)}}}))
    pinned = {"clip": {"runtime": "onnx", "dtype": "float32"}}
    profile = write_profile(tmp_path, name="onnx-images", workers=1, rows_per_item=5, runtimes=pinned)

    args = embed_args(folder, tmp_path / "out", catalog, "--verbose", profile=profile, model="clip")
    done = run_shoal(*args, timeout=600, env={"COLUMNS": "400"})  # the summary's rows on one line each
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [line for line in done.stderr.splitlines() if "runtime of clip on tcp://" in line]
    assert line.split("│")[2].strip() == "onnx float32: pinned by profile onnx-images"
    table = pq.read_table(tmp_path / "out").sort_by("id")
    assert table.column("id").to_pylist() == [f"{i:02d}.{'png' if i % 3 == 0 else 'jpg'}" for i in range(12)]
    close(table.column("embedding").to_pylist(), expected_images)

    serve = [SHOAL, "serve", "--catalog", str(catalog), "--profile", str(profile), "--port", "0", "--models", "clip"]
    with started(serve, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as proc:
        url = wait_for_line(proc.stderr, "serving").split(" on ")[1].split()[0]
        with OnlineClient(url, timeout=60) as online:
            close(online.embed_images("clip", images), expected_images)
            close(online.encode("clip", texts), expected_texts)


def test_a_catalog_width_its_graphs_do_not_give_is_refused_at_load(clip_folder: Path) -> None:
    from shoal.workers.runtimes import load_runtime

    spec = clip_spec(clip_folder).model_copy(update={"dim": 7, "runtimes": {"cpu": ONNX}})
    with pytest.raises(ValueError, match=f"catalog says dim 7, its image tower gives {CLIP_DIM}"):
        load_runtime(spec, PLAN)
