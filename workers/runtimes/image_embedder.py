"""The image and text-image embedding runtime: CLIP and SigLIP, images and texts into one space.

Two layouts load, each computed exactly as its own library computes it:

- a sentence-transformers folder (``modules.json``: a multimodal Transformer,
  or the legacy ``CLIPModel`` module): what ``SentenceTransformer.encode``
  gives for PIL images and for texts (its ``preprocess``, then its forward,
  truncated and normalised as its modules say);
- a transformers folder (``CLIPModel``, ``SiglipModel``, ``Siglip2Model``...):
  ``get_image_features`` and ``get_text_features`` on its own processor's
  features, L2-normalised (how CLIP and SigLIP are compared: such a
  folder's spec says ``normalize``). SigLIP's text
  tower pools its last position, so its texts are padded to the tokenizer's
  window as its model card says (``padding="max_length"``).

Images are decoded (Pillow, under `ImageLimits`) and resized and normalised by
the model's own image processor in a preparing thread, a batch or two ahead
of the device, so decoding overlaps the forward and never runs on the device
thread; Pillow releases the interpreter lock while it decodes and resizes.
A forward batch is at most `image_batch` images (the spec's, for this
device kind): the image analogue of the token budget. An image that cannot
be decoded is left out of its batch and returned as that input's rejection;
the rest are computed. Texts go through the text tower in token-budget
batches, as every text runtime's do (this runtime is an `Embedder` too).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from ...configs import ModelSpec
from ...configs.prompts import model_prompts
from ..batching.device_thread import DeviceThread
from ..batching.token_batching import Adapters, BatchedRuntime, Measured
from ..data.images import DEFAULT_LIMITS, ImageLimits, ImageRejected, decode
from ..devices import DevicePlan
from .token_counts import count_tokens
from .torch_model import TorchModel

# Image batches prepared ahead of the one computing: the device never waits for a decode unless decoding
# is slower than the forward, and no more than this many batches of pixels are held at once.
PREPARED_AHEAD = 2
# transformers model types whose text tower pools the last position: their texts are padded to the window.
PADDED_TEXT_TOWERS = ("siglip", "siglip2")

GATE_IMAGES = 64  # drawn images in the quality gate's sample, beside its texts

# One input of an image call: its encoded bytes, or an `ImageRejected` found before (a read that failed).
ImageInput = bytes | ImageRejected


class _Towers:
    """One layout's model and its two preprocessing and forward paths."""

    model: Any  # the torch module TorchModel casts, measures and closes
    tokenizer: Any

    def prepare_images(self, images: list[Any]) -> dict[str, Any]:
        """The model's input features for decoded images, on the CPU (the image processor's work)."""
        raise NotImplementedError

    def prepare_texts(self, texts: list[str], prompt: str) -> dict[str, Any]:
        raise NotImplementedError

    def forward(self, features: dict[str, Any]) -> Any:
        """The batch's vectors (a tensor), as the layout's library gives them."""
        raise NotImplementedError

    def dim(self) -> int:
        raise NotImplementedError


class _SentenceTransformerTowers(_Towers):
    """A sentence-transformers folder: ``preprocess`` then the modules' forward, as ``encode`` runs them."""

    def __init__(self, folder: str, spec: ModelSpec, device: str) -> None:
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(folder, device=device, local_files_only=True)
        if "image" not in self.model.modalities:
            raise ValueError(
                f"model {spec.name!r}: {folder} embeds no images (its modalities: {self.model.modalities})"
            )
        self.model.max_seq_length = spec.max_seq_length
        self.tokenizer = self.model.tokenizer

    def prepare_images(self, images: list[Any]) -> dict[str, Any]:
        return self.model.preprocess(images)

    def prepare_texts(self, texts: list[str], prompt: str) -> dict[str, Any]:
        return self.model.preprocess(texts, prompt=prompt or None)

    def forward(self, features: dict[str, Any]) -> Any:
        from sentence_transformers.util import truncate_embeddings

        vectors = self.model(features)["sentence_embedding"]
        if self.model.truncate_dim is not None:
            vectors = truncate_embeddings(vectors, self.model.truncate_dim)
        return vectors

    def dim(self) -> int:
        return int(self.model.get_embedding_dimension())


class ImageProcessing:
    """A CLIP or SigLIP folder's own processor: images resized and normalised as its image processor does,
    texts tokenized to its window (a SigLIP's padded to it). Both image runtimes prepare inputs with it."""

    def __init__(self, folder: str | Path, spec: ModelSpec) -> None:
        from transformers import AutoConfig, AutoProcessor

        self.processor = AutoProcessor.from_pretrained(folder, local_files_only=True)
        self.tokenizer = self.processor.tokenizer
        self.max_length = spec.max_seq_length
        model_type = AutoConfig.from_pretrained(folder, local_files_only=True).model_type
        self.padding: str | bool = "max_length" if model_type in PADDED_TEXT_TOWERS else True

    def images(self, images: list[Any], tensors: str = "pt") -> dict[str, Any]:
        return dict(self.processor.image_processor(images=images, return_tensors=tensors))

    def texts(self, texts: list[str], prompt: str, tensors: str = "pt") -> dict[str, Any]:
        texts = [prompt + t for t in texts] if prompt else texts
        return dict(
            self.tokenizer(
                texts, padding=self.padding, truncation=True, max_length=self.max_length, return_tensors=tensors
            )
        )


class _TransformersTowers(_Towers):
    """A transformers folder: the processor's features, ``get_image_features`` / ``get_text_features``."""

    def __init__(self, folder: str, spec: ModelSpec, device: str) -> None:
        from transformers import AutoModel

        self.processing = ImageProcessing(folder, spec)
        self.model = AutoModel.from_pretrained(folder, local_files_only=True).to(device)
        if not hasattr(self.model, "get_image_features") or not hasattr(self.model, "get_text_features"):
            raise ValueError(f"model {spec.name!r}: {type(self.model).__name__} has no image and text towers")
        self.tokenizer = self.processing.tokenizer
        self.padding = self.processing.padding

    def prepare_images(self, images: list[Any]) -> dict[str, Any]:
        return self.processing.images(images)

    def prepare_texts(self, texts: list[str], prompt: str) -> dict[str, Any]:
        return {**self.processing.texts(texts, prompt), "modality": "text"}

    def forward(self, features: dict[str, Any]) -> Any:
        import torch

        if features.get("modality") == "text":
            inputs = {k: v for k, v in features.items() if k != "modality"}
            out = self.model.get_text_features(**inputs)
        else:
            out = self.model.get_image_features(**features)
        return out if isinstance(out, torch.Tensor) else out.pooler_output  # normalised as the spec says

    def dim(self) -> int:
        config = self.model.config
        width = getattr(config, "projection_dim", None) or config.vision_config.hidden_size
        return int(width)


class ImageModel(BatchedRuntime):
    """What the image runtimes share (torch here, ONNX in onnx_image.py): images decoded and prepared a batch or
    two ahead of the device in the preparing thread, batches of `image_batch`, texts in token-budget batches.

    A runtime gives its own preparing (`image_features`, `text_features`: CPU work, off the device thread
    for images) and its own `forward` of one prepared batch to float32 vectors (one device turn).
    """

    image_batch: int
    prompts: Any
    tokenizer: Any
    padded_texts: bool  # every text is padded to the window (SigLIP): each costs the whole window
    _preparing: ThreadPoolExecutor | None = None

    def image_features(self, images: list[Any]) -> dict[str, Any]:
        """The forward's input features for decoded images (the model's image processor's work)."""
        raise NotImplementedError

    def text_features(self, texts: list[str], prompt: str) -> dict[str, Any]:
        raise NotImplementedError

    def forward(self, features: dict[str, Any]) -> np.ndarray:
        """One forward batch: float32 vectors, normalised as the spec says."""
        raise NotImplementedError

    # Texts: the Embedder protocol, through the text tower.

    def token_lengths(self, texts: list[str], prompt: str | None = None) -> Measured:
        """Token counts after truncation (as the forward pads them), and how many texts were truncated."""
        prompt = self.prompts.text(prompt=prompt)
        lengths, truncated = count_tokens(
            self.tokenizer, self.spec.max_seq_length, [prompt + t for t in texts] if prompt else texts
        )
        if self.padded_texts:  # every text costs the whole window
            lengths = np.full_like(lengths, self.spec.max_seq_length)
        return lengths, truncated

    def embed(
        self, texts: list[str], measured: Measured | None = None, prompt: str | None = None, adapters: Adapters = None
    ) -> tuple[np.ndarray, int]:
        """float32 text vectors in input order, and the count of truncated texts. `adapters`: as any
        embedder's (an image model serves none: refused unless every one is None)."""
        prompt = self.prompts.text(prompt=prompt)
        return self.in_batches(
            len(texts),
            lambda: measured or self.token_lengths(texts, prompt),
            lambda batch: self.forward(self.text_features([texts[i] for i in batch], prompt)),
            self.spec.dim,
            adapters,
        )

    # Images.

    def embed_images(
        self, images: Sequence[ImageInput], limits: ImageLimits = DEFAULT_LIMITS
    ) -> tuple[np.ndarray, dict[int, str]]:
        """float32 vectors of `images` in input order, and the inputs rejected (index -> why; their rows are 0).

        Batches of `image_batch` are decoded and prepared PREPARED_AHEAD ahead in the preparing thread;
        each forward is one device turn, so online work waiting goes between batches.
        """
        out = np.zeros((len(images), self.spec.dim), dtype=np.float32)
        rejected: dict[int, str] = {}
        starts = range(0, len(images), self.image_batch)
        pending: deque[Future] = deque()
        for start in starts:
            pending.append(self._prepare_ahead(images, start, limits))
            if len(pending) > PREPARED_AHEAD:
                self._compute(pending.popleft(), out, rejected)
        while pending:
            self._compute(pending.popleft(), out, rejected)
        return out, rejected

    def _prepare_ahead(self, images: Sequence[ImageInput], start: int, limits: ImageLimits) -> Future:
        if self._preparing is None:
            self._preparing = ThreadPoolExecutor(1, thread_name_prefix="shoal-images")
        batch = images[start : start + self.image_batch]
        return self._preparing.submit(self.prepare_images, batch, start, limits)

    def prepare_images(
        self, batch: Sequence[ImageInput], start: int, limits: ImageLimits
    ) -> tuple[np.ndarray, dict[str, Any] | None, dict[int, str]]:
        """Decode and prepare one batch (off the device thread): (indices kept, their features, rejections)."""
        decoded, kept, rejected = [], [], {}
        for offset, data in enumerate(batch):
            try:
                if isinstance(data, ImageRejected):
                    raise data
                decoded.append(decode(data, limits))
                kept.append(start + offset)
            except ImageRejected as exc:
                rejected[start + offset] = str(exc)
        features = self.image_features(decoded) if decoded else None
        for image in decoded:
            image.close()
        return np.asarray(kept, dtype=np.int64), features, rejected

    def _compute(self, prepared: Future, out: np.ndarray, rejected: dict[int, str]) -> None:
        kept, features, bad = prepared.result()
        rejected.update(bad)
        if features is None:
            return
        with self.device_thread.turn():
            out[kept] = self.forward(features)

    def gate_vectors(self, texts: list[str]) -> np.ndarray:
        """What the quality gate holds a candidate to fp32 by, and `auto` times runtimes on: the vectors of as
        many drawn images as texts, up to GATE_IMAGES (both towers' work: decode, resize, the vision tower),
        then of `texts` (the text tower)."""
        images, _ = self.embed_images(drawn_images(min(GATE_IMAGES, max(len(texts), 1))))
        return np.concatenate([images, self.embed(texts)[0]])

    def stop_preparing(self) -> None:
        """At close: the preparing thread ends, its queued batches dropped."""
        if self._preparing is not None:
            self._preparing.shutdown(wait=False, cancel_futures=True)


class ImageEmbedder(ImageModel, TorchModel):
    """Images (encoded bytes) and texts to float32 vectors in one space, on torch."""

    def __init__(
        self, spec: ModelSpec, plan: DevicePlan, device_thread: DeviceThread | None = None, dtype: str | None = None
    ) -> None:
        """`dtype`: the model's own choice (its profile entry); None takes the worker's."""
        import torch
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        self.towers = load_towers(spec, plan.device)
        super().__init__(spec, plan, self.towers.model, device_thread, dtype, self.towers.tokenizer)
        self.torch_device = torch.device(plan.device)
        self.torch_dtype = getattr(torch, self.dtype)
        self.prompts = model_prompts(spec)
        self.image_batch = spec.images_for(plan.kind)
        self.padded_texts = getattr(self.towers, "padding", True) == "max_length"
        dim = self.towers.dim()
        if dim != spec.dim:
            raise ValueError(f"model {spec.name!r}: catalog says dim {spec.dim}, the model gives {dim}")

    def image_features(self, images: list[Any]) -> dict[str, Any]:
        return self.towers.prepare_images(images)

    def text_features(self, texts: list[str], prompt: str) -> dict[str, Any]:
        return self.towers.prepare_texts(texts, prompt)

    def forward(self, features: dict[str, Any]) -> np.ndarray:
        """One forward batch: features on the device (pixels in the model's dtype), float32 vectors back."""
        import torch

        moved: dict[str, Any] = {}
        for name, value in features.items():
            if isinstance(value, torch.Tensor):
                value = value.to(self.torch_device)
                if value.is_floating_point():
                    value = value.to(self.torch_dtype)
            moved[name] = value
        with torch.inference_mode():
            return tower_vectors(self.towers, self.spec, moved).float().cpu().numpy()

    def close(self) -> None:
        self.stop_preparing()
        super().close()


def load_towers(spec: ModelSpec, device: str) -> _Towers:
    """`spec`'s model in fp32 on `device`, as its layout's library loads it."""
    folder = spec.resolve_path()
    layout = _SentenceTransformerTowers if (Path(folder) / "modules.json").is_file() else _TransformersTowers
    return layout(folder, spec, device)


def tower_vectors(towers: _Towers, spec: ModelSpec, features: dict[str, Any]) -> Any:
    """The torch forward of one batch of features: the layout's vectors, normalised as the spec says (what an
    ONNX graph of a tower is traced from)."""
    import torch

    vectors = towers.forward(features)
    return torch.nn.functional.normalize(vectors, p=2, dim=-1) if spec.normalize else vectors


@cache
def drawn_images(count: int, size: tuple[int, int] = (320, 240)) -> list[bytes]:
    """`count` different JPEGs, the same on every machine: smooth colour fields, shapes and grain, as photos
    are smooth with edges and noise (the quality gate's image sample; drawn once, as `auto` times runtimes on
    it)."""
    import io

    from PIL import Image, ImageDraw

    rng = np.random.default_rng(0)
    width, height = size
    images = []
    for _ in range(count):
        field = rng.integers(0, 256, (4, 5, 3), dtype=np.uint8)
        image = Image.fromarray(field).resize(size, Image.Resampling.BICUBIC)
        draw = ImageDraw.Draw(image)
        for _ in range(3):
            x, y = int(rng.integers(0, width - 20)), int(rng.integers(0, height - 20))
            w, h = int(rng.integers(10, width // 2)), int(rng.integers(10, height // 2))
            draw.ellipse([x, y, x + w, y + h], fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
        pixels = np.asarray(image, dtype=np.float32) + rng.normal(0, 8, (height, width, 3))
        buffer = io.BytesIO()
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buffer, format="JPEG", quality=90)
        images.append(buffer.getvalue())
    return images
