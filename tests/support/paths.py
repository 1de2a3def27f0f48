"""Where the repository, its demo corpus and the installed commands are."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "datasets" / "demo"
SHOAL = str(Path(sys.executable).parent / "shoal")
DASK = str(Path(sys.executable).parent / "dask")
