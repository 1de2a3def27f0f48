"""One import namespace: Shoal installs only `shoal`, and a user's own `configs` or `workers` beside it changes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("pipeline", "workers", "scheduler_plugins", "configs")


@pytest.mark.unit
def test_the_wheel_lists_every_package_of_the_four_folders():
    """pyproject.toml names the packages one by one (package-dir cannot be searched): a new folder must be added."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    in_tree = {
        ".".join(("shoal", *init.parent.relative_to(ROOT).parts))
        for folder in FOLDERS
        for init in (ROOT / folder).rglob("__init__.py")
    }
    assert set(setuptools["packages"]) == in_tree | {"shoal"}
    assert setuptools["package-dir"] == {"shoal": "shoal", **{f"shoal.{folder}": folder for folder in FOLDERS}}


@pytest.mark.unit
def test_the_public_api_is_the_clients():
    import shoal
    from shoal.pipeline import client

    assert shoal.OnlineClient is client.OnlineClient
    assert {name: getattr(shoal, name) for name in shoal.__all__} == {
        name: getattr(client, name) for name in shoal.__all__
    }
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        shoal.nothing  # noqa: B018


@pytest.mark.integration
def test_a_users_own_packages_beside_shoal_are_never_imported(tmp_path):
    """Packages named like Shoal's folders, first on sys.path, fail on import: Shoal must not touch them."""
    for name in FOLDERS:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('the user\\'s own {name} was imported')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "COLUMNS": "200"}
    shadowed = subprocess.run(
        [sys.executable, "-c", "import configs"], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert "the user's own configs was imported" in shadowed.stderr  # what a top-level `configs` would meet
    code = (
        "import shoal.configs, shoal.workers, shoal.scheduler_plugins, shoal.pipeline.cli\n"
        "from shoal import OnlineClient\n"
        "from shoal.configs import load_catalog\n"
        "print(OnlineClient.__module__, sorted(load_catalog().models))"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "shoal.pipeline.client" in done.stdout and "minilm" in done.stdout
    shoal_cli = Path(sys.executable).with_name("shoal")
    models = subprocess.run([str(shoal_cli), "models"], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert models.returncode == 0, models.stderr
    assert "minilm" in models.stdout
