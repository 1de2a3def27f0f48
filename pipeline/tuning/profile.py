"""Writing a tuned or derived profile: the YAML, and how its numbers were found.

A profile's figures are only as good as their provenance, so the file keeps
it as comments above the settings: the date, the machine, what was tried and
measured (or, for hardware we have not had, the published figures and the
arithmetic). The file is read back through configs.load_profile before it
replaces anything, so a tuner can never ship a profile that does not load.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from ...configs import CONFIG_DIR, GatewaySettings, Profile, load_profile

# A profile's fields as its YAML file holds them: what tuning writes, `load_profile` validates.
ProfileFields = dict[str, Any]


def profile_path(name_or_path: str) -> Path:
    """configs/NAME.yaml for a name, the path itself for a .yaml/.yml path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        return path
    return CONFIG_DIR / f"{name_or_path}.yaml"


def profile_fields(profile: Profile) -> ProfileFields:
    """The profile as YAML-ready fields, leaving out sections still at their defaults."""
    fields = profile.model_dump()
    if fields["gateway"] == GatewaySettings().model_dump():
        del fields["gateway"]
    for name in ("pinned", "token_budgets", "max_batch_sizes", "image_batches", "runtimes"):
        if not fields[name]:
            del fields[name]
    return fields


def write_profile(path: Path, fields: ProfileFields, comments: list[str]) -> Profile:
    """Write `fields` under a comment block, validated first; the profile as loaded back."""
    header = "".join(f"# {line}".rstrip() + "\n" for line in comments)
    text = header + yaml.safe_dump(fields, sort_keys=False, width=100)
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.stem}.staged.yaml")
    staged.write_text(text)
    try:
        load_profile(str(staged))
    except Exception:
        staged.unlink()
        raise
    os.replace(staged, path)
    return load_profile(str(path))
