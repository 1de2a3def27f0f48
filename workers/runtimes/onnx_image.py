"""The image kind's ONNX runtime: a CLIP or SigLIP's two towers as ONNX graphs, each exported once per model.

Each tower is one graph and one entry of the export cache (onnx_cache, the
form's name beside the model's fingerprint): the vision tower from pixel
values to the final vectors, the text tower from token ids to them. Each is
traced from the torch runtime's own forward (image_embedder.tower_vectors:
the layout's library, its Dense module or truncation, normalised as the spec
says) and checked before it is cached: the graph on this runtime's inputs
against the torch runtime in fp32 on drawn images or the check's texts
(onnx_check.check_vectors: cosine at least CHECK_MIN_COSINE), so a graph
whose inputs differ from torch's (another processor, another padding) is
never cached. int8 is the fp32 graphs quantized, as for texts.

Inputs are prepared by the model folder's own processor (image_embedder
.ImageProcessing: transformers' image processor and tokenizer, NumPy out):
images are decoded, resized and normalised in the preparing thread a batch
or two ahead of the device, as on torch; each forward is one session run
with the worker's threads (onnx_runtime.open_session), one device turn.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...configs import ModelSpec
from ...configs.image_models import tower_folder
from ...configs.prompts import model_prompts
from ..batching.device_thread import DeviceThread
from ..batching.token_batching import Adapters, Measured
from ..data.images import DEFAULT_LIMITS, ImageLimits, decode
from ..devices import DevicePlan
from .image_embedder import ImageInput, ImageModel, ImageProcessing, drawn_images, load_towers, tower_vectors
from .onnx_cache import ensure_artifact
from .onnx_check import CHECK_TEXTS, check_eval, check_vectors
from .onnx_export import GraphForm, TracedGraph, trace_to_onnx
from .onnx_runtime import open_session


def check_images() -> list[bytes]:
    """The trace's and the check's images: two sizes and aspect ratios, as the processor resizes them."""
    return [*drawn_images(6), *drawn_images(2, (97, 211))]


TOWER = "tower"  # the key naming a prepared batch's tower (not a graph input)


def processing(spec: ModelSpec) -> ImageProcessing:
    """The model folder's own processor: the transformers folder itself, or the one a sentence-transformers
    folder's module wraps."""
    folder = tower_folder(Path(spec.resolve_path()))
    if folder is None:
        raise ValueError(f"model {spec.name!r}: {spec.resolve_path()} holds no CLIP or SigLIP model")
    return ImageProcessing(folder, spec)


@dataclass(frozen=True)
class TowerForm(GraphForm):
    """One tower's graph: traced from the torch runtime's forward, fed as this runtime feeds it."""

    tower: str  # "image" (pixel values in) or "text" (token ids in)
    name: str  # its cache entry's

    def inputs(self, processor: ImageProcessing) -> dict[str, np.ndarray]:
        """This runtime's inputs for the check's images or texts (the trace's too)."""
        if self.tower == "image":
            return processor.images([decode(data) for data in check_images()], tensors="np")
        return processor.texts(CHECK_TEXTS, "", tensors="np")

    def torch_inputs(self, towers: Any) -> dict[str, Any]:
        """The torch runtime's own inputs for the same images or texts."""
        if self.tower == "image":
            return towers.prepare_images([decode(data) for data in check_images()])
        return towers.prepare_texts(CHECK_TEXTS, "")

    def export(self, spec: ModelSpec, folder: Path) -> TracedGraph:
        import torch

        towers = load_towers(spec, "cpu")
        towers.model.eval()
        feeds = self.inputs(processing(spec))
        names = list(feeds)
        # What the torch forward is given beside tensors (a sentence-transformers module's "modality"): fixed.
        constants = {k: v for k, v in self.torch_inputs(towers).items() if not isinstance(v, torch.Tensor)}
        axes = {0: "batch"} if self.tower == "image" else {0: "batch", 1: "tokens"}
        graph = _tower_graph(towers, spec, names, constants)
        graph.eval()
        trace_to_onnx(graph, feeds, names, axes, folder)
        return TracedGraph(towers, None, None, names)

    def check(self, spec: ModelSpec, traced: TracedGraph, graph: Path) -> None:
        import onnxruntime as ort
        import torch

        towers = traced.model
        check_eval(spec, towers.model)
        session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
        feeds = self.inputs(processing(spec))
        got = session.run(None, {name: feeds[name] for name in traced.input_names})[0]
        with torch.inference_mode():
            expected = tower_vectors(towers, spec, self.torch_inputs(towers)).float().numpy()
        check_vectors(spec, got, expected, f"{self.tower} vectors")


def _tower_graph(towers: Any, spec: ModelSpec, names: list[str], constants: dict[str, Any]) -> Any:
    """A module from the graph's input tensors (in `names` order) to the torch runtime's vectors."""
    import torch

    class TowerGraph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = towers.model  # a child: eval() reaches it

        def forward(self, *tensors):
            return tower_vectors(towers, spec, {**constants, **dict(zip(names, tensors))})

    return TowerGraph()


IMAGE_TOWER = TowerForm("image", "image-tower")
TEXT_TOWER = TowerForm("text", "text-tower")


class OnnxImageEmbedder(ImageModel):
    """Images (encoded bytes) and texts to float32 vectors in one space, each tower an ONNX Runtime session."""

    def __init__(self, spec: ModelSpec, plan: DevicePlan, device_thread: DeviceThread | None, dtype: str) -> None:
        super().__init__(spec, plan.kind, device_thread, plan.threads)
        self.processing = processing(spec)
        self.tokenizer = self.processing.tokenizer
        self.padded_texts = self.processing.padding == "max_length"
        self.prompts = model_prompts(spec)
        self.image_batch = spec.images_for(plan.kind)
        self.artifacts = {form.tower: ensure_artifact(spec, dtype, form) for form in (IMAGE_TOWER, TEXT_TOWER)}
        self.inputs = {tower: artifact.record().inputs for tower, artifact in self.artifacts.items()}
        self.plan = plan
        # Each tower's session is opened on its first call, outside any device turn: an image job never
        # creates the text tower's (ONNX Runtime optimises a graph when it opens it: seconds, and its memory).
        self.sessions: dict[str, Any] = {}
        self._opening = threading.Lock()
        self.session("image")

    def session(self, tower: str) -> Any:
        """`tower`'s session, opened now if this is its first call (its width checked against the spec's)."""
        with self._opening:
            if tower not in self.sessions:
                session = open_session(self.spec, self.plan, self.artifacts[tower].graph)
                width = session.get_outputs()[0].shape[-1]
                if isinstance(width, int) and width != self.spec.dim:
                    raise ValueError(
                        f"model {self.spec.name!r}: catalog says dim {self.spec.dim}, its {tower} tower gives {width}"
                    )
                self.sessions[tower] = session
            return self.sessions[tower]

    def embed(
        self, texts: list[str], measured: Measured | None = None, prompt: str | None = None, adapters: Adapters = None
    ) -> tuple[np.ndarray, int]:
        if texts:
            self.session("text")
        return super().embed(texts, measured, prompt, adapters)

    def embed_images(
        self, images: Sequence[ImageInput], limits: ImageLimits = DEFAULT_LIMITS
    ) -> tuple[np.ndarray, dict[int, str]]:
        self.session("image")
        return super().embed_images(images, limits)

    @property
    def origin(self) -> str:
        """Where the graphs came from, for the load's log line."""
        exported = any(artifact.exported for artifact in self.artifacts.values())
        return "exported and checked" if exported else "cached export"

    def memory_bytes(self) -> int:
        return sum(artifact.graph.stat().st_size for artifact in self.artifacts.values())

    def image_features(self, images: list[Any]) -> dict[str, Any]:
        return {**self.processing.images(images, tensors="np"), TOWER: "image"}

    def text_features(self, texts: list[str], prompt: str) -> dict[str, Any]:
        return {**self.processing.texts(texts, prompt, tensors="np"), TOWER: "text"}

    def forward(self, features: dict[str, Any]) -> np.ndarray:
        tower = features[TOWER]
        feeds = {name: features[name] for name in self.inputs[tower]}
        return np.asarray(self.session(tower).run(None, feeds)[0], dtype=np.float32)

    def close(self) -> None:
        self.stop_preparing()
        self.sessions = {}
        self.stop_tokenizing()
