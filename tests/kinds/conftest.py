"""The image kind's tiny models (tests/support/image_models.py), built once per session: every test using them is
an integration test (they load torch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.image_models import build_tiny_clip, build_tiny_siglip, build_tiny_st_clip


@pytest.fixture(scope="session")
def clip_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A transformers CLIPModel folder."""
    return build_tiny_clip(tmp_path_factory.mktemp("tiny-clip"))


@pytest.fixture(scope="session")
def siglip_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A transformers SiglipModel folder."""
    return build_tiny_siglip(tmp_path_factory.mktemp("tiny-siglip"))


@pytest.fixture(scope="session")
def st_clip_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sentence-transformers CLIP folder (the multimodal Transformer module)."""
    return build_tiny_st_clip(tmp_path_factory.mktemp("tiny-st-clip"))


@pytest.fixture(scope="session")
def legacy_st_clip_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sentence-transformers CLIP folder laid out as the hub's clip-ViT-* are (the CLIPModel module), normalised."""
    return build_tiny_st_clip(tmp_path_factory.mktemp("tiny-st-clip-legacy"), legacy=True, normalize=True)
