"""`shoal models`: every model a job may name, with the fields Shoal resolved for it.

Catalog entries first, then the Hugging Face ids in the local hub cache, each
read from its own files the way `--model` reads it, so a user sees before a
job what dimension, window, normalisation and named prompts it would run
with, or why a cached model cannot be used.
"""

from __future__ import annotations

from typing import TypedDict

from rich.console import Console
from rich.table import Table

from ..configs import Catalog, ConfigError, ModelSpec, Profile
from ..configs.hub import cached_models, hub_cache_dir
from ..configs.machine import probe
from ..configs.prompts import model_prompts
from .tuning.auto_runtime import listed_choice


class PromptFields(TypedDict, total=False):
    prompts: dict[str, str] | None  # None: the model's files cannot be read (`prompts_error` says why)
    default_prompt_name: str | None
    prompts_error: str


# A row of `shoal models` (and of its --json); a model that cannot be used has only name, from and error.
ModelRow = TypedDict(
    "ModelRow",
    {
        "name": str,
        "from": str,  # catalog, or hf cache
        "kind": str,
        "dim": int,
        "max_seq_length": int,
        "normalize": bool,
        "memory_bytes": int,
        "source": str,
        "token_budget_cpu": int,
        "max_batch_size": int,
        "prompts": dict[str, str] | None,
        "default_prompt_name": str | None,
        "prompts_error": str,
        "auto_runtime": str,
        "base": str,  # a LoRA adapter's base model: its row follows the base's
        "error": str,
    },
    total=False,
)


def model_rows(catalog: Catalog, profile: Profile, include_cache: bool = True) -> list[ModelRow]:
    """One row per model: where it came from, its resolved fields as `profile` tunes them, or the reason it cannot be used."""

    machine = probe()

    def row(name: str, source_kind: str, spec: ModelSpec) -> ModelRow:
        tuned = profile.tuned(spec)
        if spec.adapter is not None:  # its own weights and folder; it runs on its base's torch copy
            return {
                "name": name,
                "from": source_kind,
                "kind": tuned.kind,
                "dim": tuned.dim,
                "max_seq_length": tuned.max_seq_length,
                "normalize": tuned.normalize,
                "memory_bytes": spec.adapter.memory_bytes,
                "source": spec.adapter.source,
                "token_budget_cpu": tuned.budget_for("cpu"),
                "max_batch_size": tuned.max_batch_size,
                **prompt_fields(spec),
                "auto_runtime": f"its base's, on torch (LoRA over {spec.adapter.base})",
                "base": spec.adapter.base,
            }
        return {
            "name": name,
            "from": source_kind,
            "kind": tuned.kind,
            "dim": tuned.dim,
            "max_seq_length": tuned.max_seq_length,
            "normalize": tuned.normalize,
            "memory_bytes": tuned.memory_bytes,
            "source": tuned.source,
            "token_budget_cpu": tuned.budget_for("cpu"),
            "max_batch_size": tuned.max_batch_size,
            **prompt_fields(spec),
            "auto_runtime": listed_choice(profile, spec, machine),  # the profile's pin, else auto's choice here
        }

    adapters: dict[str, list[ModelRow]] = {}  # each base's adapters, listed under it
    for name, spec in catalog.models.items():
        if spec.adapter is not None:
            adapters.setdefault(spec.adapter.base, []).append(row(name, "catalog", spec))
    rows: list[ModelRow] = []
    for name, spec in catalog.models.items():
        if spec.adapter is None:
            rows += [row(name, "catalog", spec), *adapters.pop(name, [])]
    rows += [adapter for under_folder in adapters.values() for adapter in under_folder]  # bases named by folder
    for repo_id in cached_models() if include_cache else []:
        if repo_id in catalog.models:
            continue
        try:
            rows.append(row(repo_id, "hf cache", catalog.get(repo_id)))
        except ConfigError as exc:
            rows.append({"name": repo_id, "from": "hf cache", "error": str(exc)})
    return rows


def prompt_fields(spec: ModelSpec) -> PromptFields:
    """The model's non-empty named prompts and its default's name; a catalog entry's unreadable files: why."""
    try:
        prompts = model_prompts(spec)
    except ConfigError as exc:
        return {"prompts": None, "default_prompt_name": None, "prompts_error": str(exc)}
    named = {name: text for name, text in prompts.named.items() if text}
    return {"prompts": named, "default_prompt_name": prompts.default_name}


def _prompt_names(row: ModelRow) -> str:
    if row["prompts"] is None:
        return "?"
    return ", ".join(f"{n} (default)" if n == row["default_prompt_name"] else n for n in row["prompts"]) or "-"


def render_models(rows: list[ModelRow], console: Console) -> None:
    table = Table(
        "name", "from", "kind", "dim", "max tokens", "normalize", "weights MB", "prompts", "source", "auto runtime here"
    )
    for row in rows:
        if "error" in row:
            table.add_row(row["name"], row["from"], f"[red]{row['error']}[/red]", *[""] * 7)
            continue
        table.add_row(
            f"  └ {row['name']}" if "base" in row else row["name"],
            row["from"],
            row["kind"],
            str(row["dim"]),
            str(row["max_seq_length"]),
            "yes" if row["normalize"] else "no",
            f"{row['memory_bytes'] / 1e6:.0f}",
            _prompt_names(row),
            row["source"],
            row["auto_runtime"],
        )
    console.print(table)
    console.print(f"Hugging Face cache: {hub_cache_dir()}; a folder path works as --model too.", highlight=False)
