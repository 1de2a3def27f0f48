"""`shoal models`: every model a job may name, with the fields Shoal resolved for it.

Catalog entries first, then the Hugging Face ids in the local hub cache, each
read from its own files the way `--model` reads it, so a user sees before a
job what dimension, window, normalisation and named prompts it would run
with, or why a cached model cannot be used.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from configs import Catalog, ConfigError, ModelSpec, Profile
from configs.auto import auto_profile
from configs.machine import probe
from configs.model_resolution import cached_models, hub_cache_dir
from configs.prompts import model_prompts
from pipeline.tuning.auto_runtime import cached_choice

FIELDS = ("kind", "dim", "max_seq_length", "normalize", "memory_bytes", "source")


def model_rows(catalog: Catalog, profile: Profile, include_cache: bool = True) -> list[dict[str, Any]]:
    """One row per model: where it came from, its resolved fields as `profile` tunes them, or the reason it cannot be used."""

    machine = probe()
    threads = auto_profile(machine).torch_threads(machine.cores)

    def fields(spec: ModelSpec) -> dict[str, Any]:
        tuned = profile.tuned(spec)
        return {
            **tuned.model_dump(include=set(FIELDS)),
            "token_budget_cpu": tuned.budget_for("cpu"),
            "max_batch_size": tuned.max_batch_size,
            **prompt_fields(spec),
            "auto_runtime": cached_choice(spec, machine, threads),  # the `auto` profile's choice on this machine
        }

    rows = [{"name": name, "from": "catalog", **fields(spec)} for name, spec in catalog.models.items()]
    for repo_id in cached_models() if include_cache else []:
        if repo_id in catalog.models:
            continue
        try:
            rows.append({"name": repo_id, "from": "hf cache", **fields(catalog.get(repo_id))})
        except ConfigError as exc:
            rows.append({"name": repo_id, "from": "hf cache", "error": str(exc)})
    return rows


def prompt_fields(spec: ModelSpec) -> dict[str, Any]:
    """The model's non-empty named prompts and its default's name; a catalog entry's unreadable files: why."""
    try:
        prompts = model_prompts(spec)
    except ConfigError as exc:
        return {"prompts": None, "default_prompt_name": None, "prompts_error": str(exc)}
    named = {name: text for name, text in prompts.named.items() if text}
    return {"prompts": named, "default_prompt_name": prompts.default_name}


def _prompt_names(row: dict[str, Any]) -> str:
    if row["prompts"] is None:
        return "?"
    return ", ".join(f"{n} (default)" if n == row["default_prompt_name"] else n for n in row["prompts"]) or "-"


def render_models(rows: list[dict[str, Any]], console: Console) -> None:
    table = Table(
        "name", "from", "kind", "dim", "max tokens", "normalize", "weights MB", "prompts", "source", "auto runtime here"
    )
    for row in rows:
        if "error" in row:
            table.add_row(row["name"], row["from"], f"[red]{row['error']}[/red]", *[""] * 7)
            continue
        table.add_row(
            row["name"],
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
