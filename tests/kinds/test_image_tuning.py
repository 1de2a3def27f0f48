"""`shoal tune`'s phase 1 for an image model: images per forward batch, timed in pairs on drawn JPEGs, and the
profile's image_batches laid over the catalog's image_batch."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.configs import ModelSpec, Profile
from shoal.workers.devices import DevicePlan
from tests.support.image_models import CLIP_DIM, TEXT_WINDOW

pytestmark = pytest.mark.integration


def test_image_trials_time_each_batch_size_against_the_start(clip_folder: Path) -> None:
    from shoal.pipeline.tuning.trials import ImageTrials

    spec = ModelSpec(
        name="clip", kind="image_embedder", source=str(clip_folder), dim=CLIP_DIM, max_seq_length=TEXT_WINDOW
    )
    trials = ImageTrials(spec, DevicePlan("cpu", "cpu", "float32", 10**9, 1), 12, 6, reference={"image_batch": 4})
    try:
        seen: list[int] = []
        embed = trials.embedder.embed_images

        def counting(images, *args):
            seen.append(trials.embedder.image_batch)
            return embed(images, *args)

        trials.embedder.embed_images = counting
        outcome = trials({"image_batch": 2})
    finally:
        trials.close()
    assert (outcome.figures["rows_per_s"] or 0) > 0 and outcome.score > 0
    assert set(seen) == {2, 4} and len(seen) == 2 * 2 * 2  # 2 repeats of both, 2 items each


def test_a_profiles_image_batches_tune_the_spec() -> None:
    spec = ModelSpec(name="clip", kind="image_embedder", dim=16, max_seq_length=16)
    assert spec.images_for("cpu") == 32 and spec.images_for("cuda") == 256
    tuned = Profile(name="p", image_batches={"clip": 12}).tuned(spec)
    assert tuned.images_for("cpu") == tuned.images_for("cuda") == 12
    assert Profile(name="p", image_batches={"other": 12}).tuned(spec) is spec
