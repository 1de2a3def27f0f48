"""The classifier commands: `shoal classify` (labels per row) and `shoal extract` (entities per row).

Both read a text column as `shoal embed` does (Parquet, JSON Lines or CSV on
any fsspec store), write Parquet parts or a Lance dataset, resume, and exit
as every batch command: 0 all done, 1 failed parts or rejected rows, 2 a
user error (nothing ran).
"""

from __future__ import annotations

import sys
from typing import Any

import click
from click.core import ParameterSource
from rich.console import Console

from ..configs import ConfigError, load_catalog, load_profile
from ..configs.kinds import for_command, kind_of
from ..configs.kinds.kind import OPTION_FLAGS
from ..configs.kinds.token_classifier import AGGREGATIONS
from .cli_batch import input_format_option, output_format_option
from .cli_options import (
    cluster_options,
    model_names,
    parse_chunk,
    parse_columns,
    parse_storage_options,
    passthrough_options,
    stack,
    text_column_option,
    user_errors,
)
from .cluster import AdaptRange, connect
from .jobs.classify import (
    ClassifyRequest,
    Operation,
    check_classify_options,
    run_classify,
    run_classify_models,
)
from .jobs.engine import model_for, preflight
from .jobs.lance_output import LanceTarget
from .jobs.planner import check_apart

rows_options = stack(
    text_column_option,
    input_format_option,
    passthrough_options,
    cluster_options(storage=True),
    output_format_option,
    click.option(
        "--threshold", type=float, default=None, help="Drop labels (entities) scoring below it. [default: keep all]"
    ),
)
"""What both commands take besides their own options."""


@click.command()
@click.argument("input_url", metavar="INPUT")
@click.argument("output_url", metavar="OUTPUT")
@click.option(
    "--model",
    required=True,
    callback=model_names,
    help="A sequence classifier (kind: classifier); several, comma-separated (LoRA adapters of one base: "
    "BASE+ADAPTER), write OUTPUT/<model>/ each.",
)
@rows_options
@click.option("--top-k", type=click.IntRange(min=1), default=None, help="Keep each row's best K labels. [default: all]")
@click.option(
    "--labels",
    default=None,
    help="Zero-shot: score these comma-separated labels instead of the model's own (an NLI model: one with an "
    "entailment label).",
)
@click.option(
    "--template", default=None, help='Zero-shot: the hypothesis, {} for the label. [default: "This example is {}."]'
)
@click.option("--multi-label", is_flag=True, help="Zero-shot: score each label on its own, not one softmax over them.")
@click.option(
    "--chunk",
    default=None,
    metavar="tokens=N[,overlap=K]",
    help="Split texts longer than N tokens into windows overlapping by K; one row of labels per window.",
)
@user_errors()
def classify(labels: str | None, **options: Any) -> None:
    """Label the TEXT column of every row of INPUT: `labels`, best first, into Parquet parts under OUTPUT.

    Scores are those of transformers' text-classification pipeline (softmax, or
    sigmoid for a multi-label model); with --labels, those of its
    zero-shot-classification pipeline. INPUT is a file, directory or glob on
    any fsspec filesystem; OUTPUT a directory there.
    """
    _run("classify", labels=parse_columns(labels), **options)


@click.command()
@click.argument("input_url", metavar="INPUT")
@click.argument("output_url", metavar="OUTPUT")
@click.option(
    "--model",
    required=True,
    callback=model_names,
    help="A token classifier (kind: token_classifier), or a GLiNER span extractor (kind: span_extractor); "
    "several, comma-separated, write OUTPUT/<model>/ each.",
)
@rows_options
@click.option(
    "--aggregation",
    type=click.Choice(AGGREGATIONS),
    default="simple",
    show_default=True,
    help="How token labels become spans (the token-classification pipeline's aggregation_strategy).",
)
@click.option(
    "--labels",
    default=None,
    help="Keep only entities of these comma-separated labels [default: all]; a span extractor finds these (required).",
)
@click.option("--multi-label", is_flag=True, help="Span extractor: a span may carry more than one of the labels.")
@click.option(
    "--chunk",
    default=None,
    metavar="tokens=N[,overlap=K]",
    help="Read long texts whole, in windows of N tokens overlapping by K (the pipeline's stride); "
    "entities keep offsets into the whole text.",
)
@user_errors()
def extract(labels: str | None, **options: Any) -> None:
    """The entities of the TEXT column of every row of INPUT: `entities` (text, label, score, start, end).

    Spans, labels and scores are those of transformers' token-classification
    pipeline with --aggregation; start and end are character offsets into the
    row's text. A span extractor (GLiNER) finds the entities of --labels instead,
    scoring at least --threshold (0.5 by default), as GLiNER's inference does.
    """
    _run("extract", labels=parse_columns(labels), **options)


def _run(
    operation: Operation,
    input_url: str,
    output_url: str,
    model: str,
    chunk: str | None,
    output_format: str,
    scheduler: str | None,
    adapt: AdaptRange | None,
    storage_options: str | None,
    profile: str | None,
    catalog: str | None,
    id_column: str,
    keep_columns: str,
    **options: Any,
) -> None:
    """Check what can be checked before a cluster starts, run the job, exit with its code."""
    console = Console(stderr=True, soft_wrap=True)
    profile_config = load_profile(profile)
    catalog_config = load_catalog(catalog).reading_with(parse_storage_options(storage_options))
    models = parse_columns(model)
    specs = [model_for(catalog_config, profile_config, name, for_command(operation)) for name in models]
    spec = specs[0]
    context, kind = click.get_current_context(), kind_of(spec)
    for name, value in options.items():  # an option left at its default is not asked for: the kind may take none
        if name in OPTION_FLAGS and value not in (None, False) and name not in kind.options:
            if context.get_parameter_source(name) is ParameterSource.DEFAULT:
                options[name] = None
    lance = LanceTarget.of(output_url, output_format)
    if lance and len(models) > 1:
        raise ConfigError("a Lance OUTPUT is one dataset: give one model (or one OUTPUT per model)")
    request = ClassifyRequest(
        operation=operation,
        input=input_url,
        output=lance.staging if lance else output_url,
        lance=lance.dataset if lance else None,
        model=models[0],
        id_column=id_column or None,
        keep_columns=parse_columns(keep_columns),
        storage_options=parse_storage_options(storage_options),
        chunk=parse_chunk(chunk),
        **options,
    )
    for each in specs:
        check_classify_options(request, each)
    if lance:  # named as given: preflight checks the staging folder inside it
        check_apart(request.input, lance.dataset, request.storage_options)
    preflight(request.input, request.output, request.storage_options, request.input_format)
    with connect(scheduler, profile_config, catalog, adapt=adapt, warm=[each.name for each in specs]) as client:
        if len(models) == 1:
            outcomes = [run_classify(client, request, profile_config, catalog_config, console)]
        else:
            outcomes = run_classify_models(client, request, models, profile_config, catalog_config, console)
    sys.exit(max(outcome.exit_code for outcome in outcomes))
