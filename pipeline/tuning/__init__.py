"""`shoal tune` and the quality gate: measure this machine and write a profile for it."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The checkout this package runs from: its datasets/ hold the tuner's default sample and judged set."""
