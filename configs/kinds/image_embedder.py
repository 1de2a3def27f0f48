"""Image and text-image embedders (CLIP, SigLIP): images and texts into one vector space.

Recognised from a transformers CLIP or SigLIP folder, a sentence-transformers
folder whose module wraps one, or the legacy ``CLIPModel`` layout
(configs/image_models.py reads all three): its width is the projection's (or a
Dense module's), its window the text tower's, and a transformers folder's
vectors are normalised (a sentence-transformers one's behind a Normalize
module). Its operation is ``embed_images``: `shoal embed` of such a model over
image files or an image column (workers/operations/image_operation.py), a
text column going through the text tower; its forward batches are images per
forward (`ModelSpec.image_batch`), not a token budget.
"""

from __future__ import annotations

from typing import Any

from .. import image_models
from .kind import Gate, Kind


def vectors(runtime: Any, texts: list[str]) -> Any:
    """A drawn image sample's vectors, then the texts': what the gate compares (the image runtime's own call)."""
    return runtime.gate_vectors(texts)


def recognises(files: Any) -> bool:
    return image_models.tower_folder(files.folder) is not None


KIND = Kind(
    name="image_embedder",
    command="embed",
    operations={"embed_images": "shoal.workers.operations.image_operation"},
    api="embed",
    runtimes={
        "torch": "shoal.workers.runtimes.image_embedder:ImageEmbedder",
        "onnx": "shoal.workers.runtimes.onnx_image:OnnxImageEmbedder",
    },
    tunable=True,
    recognises=recognises,
    width=lambda files: image_models.width(files.folder),
    window=lambda files: image_models.window(files.folder),
    normalizes=lambda files: image_models.normalizes(files.folder),
    options=frozenset({"vectors", "prompt"}),
    inputs=frozenset({"texts", "images"}),
    gate=Gate("cosine", vectors),
)
