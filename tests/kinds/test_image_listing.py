"""`shoal models` lists an image model as its files describe it: kind, width, window, normalisation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.support.cli import invoke_shoal
from tests.support.image_models import CLIP_DIM, SIGLIP_DIM, TEXT_WINDOW

pytestmark = pytest.mark.integration


def test_shoal_models_reads_clip_and_siglip_folders(
    clip_folder: Path, siglip_folder: Path, st_clip_folder: Path, tmp_path
):
    catalog = tmp_path / "catalog.yaml"
    models = {"clip": str(clip_folder), "siglip": str(siglip_folder), "st-clip": str(st_clip_folder)}
    catalog.write_text(yaml.safe_dump({"models": {name: {"source": source} for name, source in models.items()}}))
    listed = invoke_shoal("models", "--catalog", str(catalog), "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert {
        name: (rows[name]["kind"], rows[name]["dim"], rows[name]["max_seq_length"], rows[name]["normalize"])
        for name in models
    } == {
        "clip": ("image_embedder", CLIP_DIM, TEXT_WINDOW, True),  # transformers: normalised, as CLIP compares
        "siglip": ("image_embedder", SIGLIP_DIM, TEXT_WINDOW, True),
        "st-clip": ("image_embedder", CLIP_DIM, TEXT_WINDOW, False),  # sentence-transformers: as encode gives them
    }
