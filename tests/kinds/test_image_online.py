"""An image model online through `shoal serve`: the official cohere client's embed(images=..., input_type="image"),
OpenAI's embeddings with data URIs, Shoal's MessagePack with raw bytes (OnlineClient.embed_images), texts through
the same model's text tower; every answer compared with the reference library's vectors; a non-image is a 400
naming its input, and the server keeps serving.
"""

from __future__ import annotations

import io
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from shoal.pipeline.client import OnlineClient, OnlineError
from tests.support.files import write_profile
from tests.support.image_models import data_uri, decompression_bomb, draw_images, encoded, truncated
from tests.support.paths import SHOAL
from tests.support.processes import started, wait_for_line

pytestmark = pytest.mark.integration

KEY = "unused"  # auth is off


@pytest.fixture(scope="module")
def url(clip_folder: Path, st_clip_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`shoal serve` of `clip` (a transformers CLIP folder) and `st-clip` (a sentence-transformers one)."""
    folder = tmp_path_factory.mktemp("serve-images")
    catalog = folder / "catalog.yaml"
    catalog.write_text(
        yaml.safe_dump({"models": {"clip": {"source": str(clip_folder)}, "st-clip": {"source": str(st_clip_folder)}}})
    )
    profile = write_profile(folder, name="serve-images", workers=1, device="cpu")
    command = [SHOAL, "serve", "--catalog", str(catalog), "--profile", str(profile), "--port", "0"]
    command += ["--models", "clip,st-clip"]
    with started(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as proc:
        line = wait_for_line(proc.stderr, "serving")
        yield line.split(" on ")[1].split()[0]


def pil(data: bytes):
    from PIL import Image

    return Image.open(io.BytesIO(data))


def clip_reference(folder: Path, images: list[bytes], texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Normalised get_image_features and get_text_features."""
    import torch
    from transformers import AutoModel, AutoProcessor

    model = AutoModel.from_pretrained(folder).eval()
    processor = AutoProcessor.from_pretrained(folder)
    with torch.inference_mode():
        image_vectors = model.get_image_features(**processor(images=[pil(d) for d in images], return_tensors="pt"))
        tokens = processor(text=texts, return_tensors="pt", padding=True, truncation=True, max_length=16)
        text_vectors = model.get_text_features(**tokens)
    normalize = torch.nn.functional.normalize
    return normalize(image_vectors.pooler_output, dim=-1).numpy(), normalize(text_vectors.pooler_output, dim=-1).numpy()


IMAGES = [encoded(p, "PNG" if i % 2 else "JPEG") for i, p in enumerate(draw_images(5, seed=11))]
TEXTS = ["a red cat", "a blue boat"]


def close(got, expected) -> None:
    got = np.asarray(got, dtype=np.float32)
    cosine = (got * expected).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)
    assert cosine.min() >= 0.9999
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_cohere_openai_and_messagepack_give_the_reference_vectors(url: str, clip_folder: Path, st_clip_folder: Path):
    import cohere
    import openai
    from sentence_transformers import SentenceTransformer

    expected_images, expected_texts = clip_reference(clip_folder, IMAGES, TEXTS)
    uris = [data_uri(data, "image/png" if i % 2 else "image/jpeg") for i, data in enumerate(IMAGES)]

    co = cohere.ClientV2(api_key=KEY, base_url=url)
    answer = co.embed(model="clip", images=uris, input_type="image", embedding_types=["float"])
    close(answer.embeddings.float_, expected_images)
    texts = co.embed(model="clip", texts=TEXTS, input_type="search_query", embedding_types=["float"])
    close(texts.embeddings.float_, expected_texts)

    oa = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY)
    close([d.embedding for d in oa.embeddings.create(model="clip", input=uris).data], expected_images)
    close([d.embedding for d in oa.embeddings.create(model="clip", input=TEXTS).data], expected_texts)

    with OnlineClient(url, timeout=60) as online:
        close(online.embed_images("clip", IMAGES), expected_images)
        close(online.encode("clip", TEXTS), expected_texts)
        st = SentenceTransformer(str(st_clip_folder), device="cpu")
        close(online.embed_images("st-clip", [pil(d) for d in IMAGES]), st.encode([pil(d) for d in IMAGES]))
        close(online.encode("st-clip", TEXTS), st.encode(TEXTS))


def test_a_non_image_is_a_400_naming_its_input_and_the_server_keeps_serving(url: str):
    import cohere
    import openai

    good = data_uri(IMAGES[0])
    co = cohere.ClientV2(api_key=KEY, base_url=url)
    with pytest.raises(cohere.core.ApiError) as refused:
        co.embed(model="clip", images=[good, data_uri(b"%PDF-1.7 not an image")], input_type="image")
    assert refused.value.status_code == 400 and "images[1] is not an image" in str(refused.value.body)

    oa = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError, match=r"input\[2\] is 10000x10000"):
        oa.embeddings.create(model="clip", input=[good, good, data_uri(decompression_bomb(), "image/png")])

    with OnlineClient(url, timeout=60) as online:
        with pytest.raises(OnlineError) as damaged:  # its header reads: the worker's decode finds it
            online.embed_images("clip", [IMAGES[0], IMAGES[1], truncated(IMAGES[2])])
        assert damaged.value.status == 400 and "input 2 is not an image that decodes" in str(damaged.value)
        with pytest.raises(OnlineError, match="embeds no images"):
            online.embed_images("minilm", [IMAGES[0]])
        assert online.embed_images("clip", IMAGES[:2]).shape == (2, 16)  # still serving


async def test_the_async_client_embeds_images_too(url: str, clip_folder: Path):
    from shoal.pipeline.client import AsyncOnlineClient

    expected, _ = clip_reference(clip_folder, IMAGES[:3], TEXTS)
    async with AsyncOnlineClient(url, timeout=60) as online:
        close(await online.embed_images("clip", IMAGES[:3]), expected)
