"""The image kind's runtime against its reference libraries, on tiny CLIP and SigLIP models built here.

Images: ``SentenceTransformer.encode`` of the same PIL images for a sentence-transformers CLIP folder (both its
layouts), the L2-normalised ``get_image_features`` of the processor's pixels for a transformers CLIP or SigLIP
folder. Texts: the same libraries' text towers. Bad images (truncated, not an image, a decompression bomb)
are each input's rejection, and every other image is computed.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from shoal.configs import ModelSpec, RuntimeChoice
from shoal.workers.data.images import ImageLimits, ImageRejected, decode
from shoal.workers.devices import DevicePlan
from tests.support.image_models import (
    CLIP_DIM,
    SIGLIP_DIM,
    TEXT_WINDOW,
    decompression_bomb,
    draw_images,
    encoded,
    truncated,
)

pytestmark = pytest.mark.integration

TEXTS = ["a red cat", "a blue boat", "", "a photo of a blue dog on a long winding road by the sea"]
PLAN = DevicePlan("cpu", "cpu", "float32", 10**9, 1)


def image_spec(folder: Path, dim: int, normalize: bool, batch: int = 3) -> ModelSpec:
    return ModelSpec(
        name=folder.name,
        kind="image_embedder",
        source=str(folder),
        dim=dim,
        max_seq_length=TEXT_WINDOW,
        normalize=normalize,
        image_batch={"cpu": batch},
        token_budget={"cpu": 64},  # several text batches
    )


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def pil(data: bytes):
    from PIL import Image

    return Image.open(io.BytesIO(data))


def sentence_transformers_reference(folder: Path, images: list[bytes], texts: list[str]):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    return model.encode([pil(d) for d in images]), model.encode(texts)


def transformers_reference(folder: Path, images: list[bytes], texts: list[str]):
    import torch
    from transformers import AutoModel, AutoProcessor

    model = AutoModel.from_pretrained(folder).eval()
    processor = AutoProcessor.from_pretrained(folder)
    # SigLIP's model card: texts padded to the window, as it was trained
    padding = "max_length" if model.config.model_type == "siglip" else True
    with torch.inference_mode():
        pixels = processor(images=[pil(d) for d in images], return_tensors="pt")
        image_vectors = model.get_image_features(**pixels).pooler_output
        tokens = processor(text=texts, return_tensors="pt", padding=padding, truncation=True, max_length=TEXT_WINDOW)
        text_vectors = model.get_text_features(**tokens).pooler_output
    normalize = torch.nn.functional.normalize
    return normalize(image_vectors, dim=-1).numpy(), normalize(text_vectors, dim=-1).numpy()


LAYOUTS = {
    # fixture, width, whether the folder's vectors are normalised, reference
    "transformers-clip": ("clip_folder", CLIP_DIM, True, transformers_reference),
    "transformers-siglip": ("siglip_folder", SIGLIP_DIM, True, transformers_reference),
    "st-clip": ("st_clip_folder", CLIP_DIM, False, sentence_transformers_reference),
    "st-clip-legacy": ("legacy_st_clip_folder", CLIP_DIM, True, sentence_transformers_reference),
}


@pytest.mark.parametrize("runtime_name", ["torch", "onnx"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_vectors_equal_the_reference_library(layout: str, runtime_name: str, request: pytest.FixtureRequest) -> None:
    """Both runtimes: torch, and ONNX (each tower exported, checked and cached, then run from the cache)."""
    from shoal.workers.runtimes import load_runtime

    fixture, dim, normalize, reference = LAYOUTS[layout]
    folder = request.getfixturevalue(fixture)
    # JPEG and PNG, several sizes (the processor resizes and crops each), a batch of 3 cut across them
    pictures = draw_images(5, seed=1) + draw_images(3, seed=2, size=(100, 37))
    images = [encoded(p, "JPEG" if i % 2 else "PNG") for i, p in enumerate(pictures)]
    expected_images, expected_texts = reference(folder, images, TEXTS)

    choice = RuntimeChoice.model_validate({"runtime": runtime_name, "dtype": "float32"})
    runtime = load_runtime(image_spec(folder, dim, normalize).model_copy(update={"runtimes": {"cpu": choice}}), PLAN)
    try:
        assert type(runtime).__name__ == {"torch": "ImageEmbedder", "onnx": "OnnxImageEmbedder"}[runtime_name]
        vectors, rejected = runtime.embed_images(images)
        text_vectors, truncated_texts = runtime.embed(TEXTS)
    finally:
        runtime.close()

    assert rejected == {}
    assert vectors.shape == (len(images), dim) and vectors.dtype == np.float32
    assert cosines(vectors, expected_images).min() >= 0.9999
    np.testing.assert_allclose(vectors, expected_images, atol=1e-5 if runtime_name == "torch" else 1e-4)
    assert cosines(text_vectors, expected_texts).min() >= 0.9999
    np.testing.assert_allclose(text_vectors, expected_texts, atol=1e-5 if runtime_name == "torch" else 1e-4)
    assert truncated_texts == 1  # the long text passes the 16-token window
    if normalize:
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_bad_images_are_rejected_one_by_one_and_the_rest_computed(clip_folder: Path) -> None:
    from shoal.workers.runtimes.image_embedder import ImageEmbedder

    good = [encoded(p) for p in draw_images(6, seed=3)]
    inputs: list[bytes | ImageRejected] = [
        good[0],
        truncated(good[1]),
        good[2],
        b"%PDF-1.7 not an image",
        decompression_bomb(),
        good[3],
        ImageRejected("no such file"),  # a read that failed before the runtime saw it
        good[4],
    ]
    expected, _ = transformers_reference(clip_folder, [good[i] for i in (0, 2, 3, 4)], ["x"])
    runtime = ImageEmbedder(image_spec(clip_folder, CLIP_DIM, True), PLAN)
    try:
        vectors, rejected = runtime.embed_images(inputs)
    finally:
        runtime.close()

    assert sorted(rejected) == [1, 3, 4, 6]
    assert "truncated" in rejected[1]
    assert rejected[3].startswith("not an image")
    assert "10000x10000 = 100,000,000 pixels, over the limit of 89,478,485" in rejected[4]
    assert rejected[6] == "no such file"
    np.testing.assert_allclose(vectors[[0, 2, 5, 7]], expected, atol=1e-5)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_stays_close_to_fp32(clip_folder: Path, dtype: str) -> None:
    from shoal.workers.runtimes.image_embedder import ImageEmbedder

    images = [encoded(p) for p in draw_images(6, seed=4)]
    spec = image_spec(clip_folder, CLIP_DIM, True)
    full = ImageEmbedder(spec, PLAN)
    half = ImageEmbedder(spec, PLAN, dtype=dtype)
    try:
        assert half.memory_bytes() < 0.55 * full.memory_bytes()  # the weights in half; integer buffers stay
        reference, _ = full.embed_images(images)
        vectors, rejected = half.embed_images(images)
        text_reference, _ = full.embed(TEXTS)
        text_vectors, _ = half.embed(TEXTS)
    finally:
        full.close()
        half.close()
    assert rejected == {}
    assert cosines(vectors, reference).min() > 0.99
    assert cosines(text_vectors, text_reference).min() > 0.99


def test_a_folder_without_an_image_tower_is_refused(tmp_path: Path) -> None:
    from shoal.workers.runtimes.image_embedder import ImageEmbedder
    from tests.support.models import TINY_DIM, build_tiny_embedder

    folder = build_tiny_embedder(tmp_path)
    with pytest.raises(ValueError, match="embeds no images"):
        ImageEmbedder(image_spec(folder, TINY_DIM, True), PLAN)


def test_decode_limits() -> None:
    image = draw_images(1, size=(64, 64))[0]
    data = encoded(image, "PNG")
    assert decode(data).size == (64, 64)
    with pytest.raises(ImageRejected, match=r"64x64 = 4,096 pixels, over the limit of 4,095"):
        decode(data, ImageLimits(max_pixels=4095))
    with pytest.raises(ImageRejected, match=rf"{len(data):,} bytes, over the limit of 100"):
        decode(data, ImageLimits(max_bytes=100))
    with pytest.raises(ImageRejected, match="empty"):
        decode(b"")


def test_the_quality_gate_holds_half_precision_to_fp32_on_images_and_texts(clip_folder: Path) -> None:
    from shoal.configs import RuntimeChoice
    from shoal.pipeline.tuning.quality_gate import PrecisionGate, judge_vectors
    from shoal.workers.runtimes.image_embedder import GATE_IMAGES, ImageEmbedder, drawn_images

    spec = image_spec(clip_folder, CLIP_DIM, True)
    texts = TEXTS * (GATE_IMAGES // len(TEXTS))  # as many drawn images as texts, GATE_IMAGES at most
    gate = PrecisionGate(spec, PLAN, texts, judged_set=None)
    verdict = gate.check(RuntimeChoice(runtime="torch", dtype="bfloat16"))

    full, half = ImageEmbedder(spec, PLAN), ImageEmbedder(spec, PLAN, dtype="bfloat16")
    try:
        images = drawn_images(GATE_IMAGES)
        assert len(set(images)) == GATE_IMAGES  # each its own picture
        reference = np.concatenate([full.embed_images(images)[0], full.embed(texts)[0]])
        candidate = np.concatenate([half.embed_images(images)[0], half.embed(texts)[0]])
    finally:
        full.close()
        half.close()
    figures, failures = judge_vectors(candidate, reference)
    assert verdict.figures == pytest.approx(figures, abs=1e-6) and verdict.failures == failures
    assert verdict.texts == len(texts)
