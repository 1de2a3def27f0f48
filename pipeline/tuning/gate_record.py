"""The gate's inputs and its record: the user's sample texts in, the verdict into the profile.

The choice and its evidence are written as the profile's
``runtimes.MODEL`` entry; the profile's comment block (its tuning
provenance) is kept, with one line added saying when the gate ran.
"""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow.parquet as pq
from rich.table import Table

from ...configs import ConfigError, GateEvidence, RuntimeDType, RuntimeName, load_profile
from .profile import ProfileFields, profile_fields, profile_path, write_profile
from .quality_gate import Verdict


def read_sample(path: str, limit: int, text_column: str = "text", seed: int = 0) -> list[str]:
    """Up to `limit` non-empty texts (seeded draw): a Parquet file's `text_column`, else one text per line."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"{path}: no such file")
    if file.suffix == ".parquet":
        schema = pq.read_schema(file)
        if text_column not in schema.names:
            raise ConfigError(f"{path}: no column {text_column!r} (columns: {', '.join(schema.names)})")
        texts = [
            t for t in pq.read_table(file, columns=[text_column]).column(text_column).to_pylist() if t and t.strip()
        ]
    else:
        try:
            texts = [line.rstrip("\n") for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"{path}: not UTF-8 text (byte {exc.start}); give a .parquet file or text lines"
            ) from None
    if len(texts) < 2:
        raise ConfigError(f"{path}: {len(texts)} non-empty texts; the gate needs at least 2")
    return random.Random(seed).sample(texts, min(limit, len(texts)))


def record_verdict(profile: str, verdict: Verdict, note: str) -> Path:
    """Write `verdict`'s choice and evidence into the profile's runtimes.MODEL entry.

    A refused candidate is recorded too, marked refused, only when nothing
    was chosen for the model before: a refusal never replaces a choice.
    """
    path = profile_path(profile)
    loaded = load_profile(str(path))
    fields = profile_fields(loaded)
    runtimes = dict(fields.get("runtimes") or {})
    if not verdict.passed and verdict.model in runtimes:
        return path
    gate: GateEvidence = verdict.evidence()
    entry: ProfileFields = {"runtime": verdict.choice.runtime, "dtype": verdict.choice.dtype, "gate": gate}
    if not verdict.passed:  # kept as evidence; the model runs on fp32 torch
        entry.update(runtime="torch", dtype="float32")
        gate["refused_candidate"] = f"{verdict.choice.runtime} {verdict.choice.dtype}"
    runtimes[verdict.model] = entry
    fields["runtimes"] = runtimes
    comments = [line[2:] if line.startswith("# ") else line.lstrip("#") for line in _header(path)]
    write_profile(path, fields, [*comments, note])
    return path


def _header(path: Path) -> list[str]:
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return lines


def gate_candidates(
    model: str,
    profile: str | None,
    catalog: str | None,
    texts_file: str | None,
    text_column: str,
    sample: int,
    runtime: RuntimeName | None,
    dtype: RuntimeDType | None,
) -> tuple[list[Verdict], bool, str]:
    """Verdicts of `shoal check-precision`, whether they were one candidate's (recordable), and the profile
    entry that decides the model's runtime (`Profile.entry_of`: a LoRA adapter's base, unless merged).

    The candidate is the one named, else the profile's choice for the model,
    else every candidate for the profile's kind of device. A LoRA adapter is checked against its own fp32
    output, on torch only (its layers live in its base's torch model).
    """
    from ...configs import RuntimeChoice, load_catalog
    from ...workers.devices import apply_torch_threads, detect_device
    from .auto_runtime import gate_texts
    from .quality_gate import PrecisionGate, candidates
    from .sample import draw_sample
    from .tune import DEMO_INPUT

    loaded = load_profile(profile)
    spec = loaded.tuned(load_catalog(catalog).get(model))
    plan = detect_device(loaded, {})
    apply_torch_threads(plan)
    if texts_file:
        texts = read_sample(texts_file, sample, text_column)
    elif Path(DEMO_INPUT).is_dir():  # a checkout's demo corpus
        import tempfile

        with tempfile.TemporaryDirectory(prefix="shoal-gate-") as folder:
            texts = draw_sample(DEMO_INPUT, sample, Path(folder)).texts
    else:  # an installed Shoal (the image) has no datasets/: the sample auto's gate uses, shipped in the package
        texts = gate_texts()[:sample]
    if runtime or dtype:
        chosen = [RuntimeChoice(runtime=runtime or "torch", dtype=dtype or "auto")]
    elif loaded.entry_of(spec) in loaded.runtimes:
        chosen = [loaded.runtimes[loaded.entry_of(spec)]]
    else:
        chosen = [c for c in candidates(plan.kind, spec.kind) if spec.adapter is None or c.runtime == "torch"]
    gate = PrecisionGate(spec, plan, texts)
    verdicts = [gate.check(choice.model_copy(update={"gate": None})) for choice in chosen]
    return verdicts, len(chosen) == 1, loaded.entry_of(spec)


def verdict_table(model: str, verdicts: list[Verdict]) -> Table:
    """`shoal check-precision`'s table: one row per candidate, its figures, speed against fp32, verdict."""
    table = Table(title=f"precision gate: {model} against torch float32 on {verdicts[0].texts} texts")
    names = list(dict.fromkeys(name for v in verdicts for name in v.figures))
    for column in ("runtime", "dtype", "load s", "texts/s", "vs fp32", *names, "verdict"):
        table.add_column(column, justify="left" if column in ("runtime", "dtype", "verdict") else "right")
    for v in verdicts:
        table.add_row(
            v.choice.runtime,
            v.choice.dtype,
            f"{v.load_seconds:.2f}",
            f"{v.texts_per_second:.1f}",
            f"{v.texts_per_second / v.reference_texts_per_second:.2f}x",
            *(f"{v.figures[n]:.4f}" if n in v.figures else "-" for n in names),
            "pass" if v.passed else "[red]refused[/red]",
        )
    return table
