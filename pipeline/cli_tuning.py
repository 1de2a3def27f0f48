"""The tuning commands: `shoal tune` (write a profile for this machine or a GPU) and `check-precision`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import get_args

import click
from rich.console import Console

from ..configs import RuntimeDType, RuntimeName, load_catalog
from ..configs.kinds import kind_of
from .cli_options import catalog_option, model_names, parse_columns, text_column_option, user_errors
from .tuning.derived import GPUS


@click.command()
@click.option("--profile", "name", required=True, help="Profile to write: a name (configs/NAME.yaml) or a YAML path.")
@click.option(
    "--models",
    default="minilm",
    show_default=True,
    callback=model_names,
    help="Comma-separated catalog models to tune for.",
)
@click.option("--budget-minutes", default=10.0, show_default=True, help="Stop starting trials after this long.")
@click.option(
    "--input",
    "input_url",
    default=None,
    help="Parquet corpus to sample texts from. [default: a checkout's demo corpus; required in an installed Shoal]",
)
@text_column_option
@click.option(
    "--sample-rows", default=2048, show_default=True, help="Most texts per cluster trial; fewer on a slow machine."
)
@click.option(
    "--online-rate", default=2.0, show_default=True, help="Online requests/s during cluster trials; 0: batch only."
)
@click.option(
    "--p99-ms", type=float, default=None, help="Online p99 target. [default: none on CPU (measured only), 200 on GPU]"
)
@click.option("--base", default=None, help="Profile to start from. [default: NAME if it exists, else cpu-local]")
@click.option(
    "--derive",
    type=click.Choice(sorted(GPUS)),
    default=None,
    help="Write a profile derived from this GPU's published figures instead of measuring.",
)
@catalog_option
@user_errors()
def tune(
    name: str,
    models: str,
    budget_minutes: float,
    input_url: str | None,
    text_column: str,
    sample_rows: int,
    online_rate: float,
    p99_ms: float | None,
    base: str | None,
    derive: str | None,
    catalog: str | None,
) -> None:
    """Measure this machine and write a tuned profile (or derive one for a GPU with --derive).

    Sweeps token budget and batch cap per model, then worker layout, prefetch,
    item size and models per device on embedded clusters, by coordinate
    search; the chosen settings and every trial's figures go to the file.
    """
    # Imported here: every other command (`shoal embed` first) would pay for the tuner's imports at its start.
    from .tuning.derived import derive as derive_gpu
    from .tuning.profile import profile_path, write_profile
    from .tuning.tune import DEMO_INPUT, TuneRequest
    from .tuning.tune import tune as tune_profile

    console = Console(stderr=True, soft_wrap=True)
    names = parse_columns(models)
    if derive:
        fields, comments = derive_gpu(derive, load_catalog(catalog), names)
        path = profile_path(name)
        write_profile(path, {**fields, "name": path.stem}, comments)
        console.print(f"wrote {path} (derived from published {derive} figures)")
        return
    known = load_catalog(catalog)
    other = {n: kind.name for n in names if not (kind := kind_of(known.get(n))).tunable}
    if other:
        listed = ", ".join(f"{n} ({k})" for n, k in other.items())
        raise click.UsageError(
            f"shoal tune sweeps embedders, rerankers and image models; not {listed}: those run in the workers' dtype on their "
            "catalog entry's token budget (docs/TUNING.md)"
        )
    if input_url is None and not Path(DEMO_INPUT).is_dir():
        raise click.UsageError(
            "no --input, and no demo corpus to sample (an installed Shoal has no datasets/): "
            "pass --input PATH, a Parquet corpus of your own texts (a few thousand rows or more)"
        )
    request = TuneRequest(
        name,
        names,
        budget_minutes,
        input_url or DEMO_INPUT,
        text_column,
        catalog,
        base,
        sample_rows,
        online_rate=online_rate,
        p99_ms=p99_ms,
    )
    tune_profile(request, console)


@click.command(name="check-precision")
@click.option("--model", required=True, callback=model_names, help="Catalog name of the embedder or reranker to check.")
@click.option("--profile", default=None, help="Profile whose choice is checked and where the verdict is written.")
@click.option(
    "--texts",
    "texts_file",
    default=None,
    type=click.Path(dir_okay=False),
    help="Your sample: a .parquet file or one text per line. "
    "[default: a checkout's demo corpus, else the 64-text gate sample shipped in the package]",
)
@click.option("--text-column", default="text", show_default=True, help="The text column of a .parquet sample.")
@click.option("--sample", default=512, show_default=True, help="Most texts drawn from the sample.")
@click.option(
    "--runtime",
    type=click.Choice(get_args(RuntimeName)),
    default=None,
    help="Candidate runtime. [default: the profile's choice, else every candidate]",
)
@click.option("--dtype", type=click.Choice(get_args(RuntimeDType)), default=None, help="Candidate dtype.")
@catalog_option
def check_precision(
    model: str,
    profile: str | None,
    texts_file: str | None,
    text_column: str,
    sample: int,
    runtime: RuntimeName | None,
    dtype: RuntimeDType | None,
    catalog: str | None,
) -> None:
    """Gate a runtime/dtype against fp32 torch: cosine mean >= 0.999 and min >= 0.99 (and nDCG@10 within 0.005)
    for embedders, Kendall tau >= 0.99 for rerankers. With --profile, one candidate's verdict is written into it.
    Exit 1 when a single candidate is refused."""
    from .tuning.gate_record import gate_candidates, record_verdict, verdict_table

    console = Console(stderr=True, soft_wrap=True)
    with user_errors(ValueError):  # besides USER_ERRORS: a model or sample the gate cannot use
        verdicts, single, entry = gate_candidates(
            model, profile, catalog, texts_file, text_column, sample, runtime, dtype
        )
    out = Console(soft_wrap=True)
    out.print(verdict_table(model, verdicts))
    for v in verdicts:
        if not v.passed:
            out.print(f"{v.choice.runtime} {v.choice.dtype} refused: " + "; ".join(v.failures))
    if single and profile and entry != model:  # an adapter in its base's forward passes: the base's runtime
        console.print(
            f"not written: {model} computes in {entry}'s forward passes, so runtimes.{entry} decides its runtime; "
            f"check {entry} and each of its adapters with the same --dtype, or merge this one (merged_adapters)"
        )
    elif single and profile:
        path = record_verdict(profile, verdicts[0], f"check-precision {verdicts[0].summary()}")
        console.print(f"verdict written into {path} (runtimes.{model})")
    if single and not verdicts[0].passed:
        sys.exit(1)
