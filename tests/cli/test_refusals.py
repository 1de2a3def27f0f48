"""Commands refused before any work: blank model names, OUTPUT inside INPUT (local, Lance, S3), outputs that
cannot be written, globs matching nothing, vector options no part can hold.

Each runs `shoal` in this process against an unreachable scheduler: a refusal comes before any cluster is
reached (and before anything is written).
"""

from __future__ import annotations

import json
import os

import click
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import s3fs
import yaml

from tests.support.cli import embed_args, invoke_shoal, reindex_job
from tests.support.files import read_only_folder, write_rows, write_shards
from tests.support.s3 import s3_options

UNREACHABLE = "tcp://127.0.0.1:9"  # a refusal that comes first never gets as far as this scheduler
SIM = {"kind": "sim", "dim": 16, "max_seq_length": 64, "memory_bytes": 1000}


@pytest.fixture
def sim_catalog(tmp_path):
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump({"models": {"sim": SIM}}))
    return path


# -- blank model names -----------------------------------------------------------------------


def _model_options() -> list[tuple[str, str, int]]:
    """(command, option, its required arguments) for every option of every command that names models."""
    from shoal.pipeline.cli import main

    found = []
    for name, command in sorted(main.commands.items()):
        arguments = sum(isinstance(p, click.Argument) and p.required for p in command.params)
        found += [
            (name, option, arguments)
            for p in command.params
            for option in p.opts
            if option in ("--model", "--models", "--reranker")
        ]
    return found


def test_the_options_found_are_every_model_option_of_every_command():
    assert {(c, o) for c, o, _ in _model_options()} == {
        ("check-precision", "--model"),
        ("classify", "--model"),
        ("embed", "--model"),
        ("eval", "--model"),
        ("eval", "--reranker"),
        ("extract", "--model"),
        ("rerank", "--model"),
        ("serve", "--models"),
        ("tune", "--models"),
    }


@pytest.mark.parametrize("command, option, arguments", _model_options())
@pytest.mark.parametrize("blank", ["", " ", ",", " , "])
def test_a_blank_model_list_is_a_usage_error_naming_the_option(command, option, arguments, blank, tmp_path):
    result = invoke_shoal(command, *[str(tmp_path / f"arg{i}") for i in range(arguments)], option, blank)
    assert result.returncode == 2, result.stderr
    assert f"Invalid value for '{option}'" in result.stderr and "names no model" in result.stderr, result.stderr


# -- OUTPUT inside INPUT -----------------------------------------------------------------------


def _embed(source, output, catalog, *extra: str):
    return invoke_shoal(*embed_args(source, output, catalog, *extra, scheduler=UNREACHABLE, model="sim"))


@pytest.mark.parametrize(
    "source, output, expected",
    [
        ("data", "data/vectors", "is inside input"),
        ("data/", "data/vectors/", "is inside input"),
        ("data/*.parquet", "data/vectors", "is inside input"),
        ("data", "data/nested/deeper/vectors", "is inside input"),
        ("data", "data", "is the input folder"),
        ("data/", "data", "is the input folder"),
        ("data/sub", "data", "is inside output"),
    ],
)
def test_output_and_input_that_overlap_are_refused_before_anything_is_written(
    sim_catalog, tmp_path, source, output, expected
):
    write_shards(tmp_path / "data", ["a", "b"], shards=1, row_group_size=2)
    write_shards(tmp_path / "data" / "sub", ["c"], shards=1, row_group_size=1)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    result = _embed(tmp_path / source, tmp_path / output, sim_catalog)
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr and "OUTPUT" in result.stderr, result.stderr
    assert repr(str(tmp_path / source)) in result.stderr and repr(str(tmp_path / output)) in result.stderr
    assert "cannot reach the scheduler" not in result.stderr
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # not even a write probe


def test_output_beside_input_and_a_file_beside_its_parts_pass_the_preflight(tmp_path):
    from shoal.pipeline.jobs.engine import preflight

    write_shards(tmp_path / "data", ["a", "b"], shards=1, row_group_size=2)
    for source, output in (("data", "data-vectors"), ("data/shard-000.parquet", "data"), ("data", "database")):
        preflight(str(tmp_path / source), str(tmp_path / output), {})


def test_a_lance_output_inside_input_is_refused_naming_the_dataset(sim_catalog, tmp_path):
    write_shards(tmp_path / "data", ["a", "b"], shards=1, row_group_size=2)
    dataset = tmp_path / "data" / "vectors.lance"
    result = _embed(tmp_path / "data", f"lance://{dataset}", sim_catalog)
    assert result.returncode == 2, result.stderr
    assert f"output {str(dataset)!r} is inside input" in result.stderr, result.stderr
    assert not dataset.exists()


def test_a_reindex_job_with_its_output_inside_its_input_is_refused_before_its_lock(sim_catalog, tmp_path):
    write_shards(tmp_path / "data", ["a", "b"], shards=1, row_group_size=2)
    job = tmp_path / "job.yaml"
    spec = reindex_job(tmp_path / "data", tmp_path / "data" / "index", sim_catalog, UNREACHABLE, model="sim")
    job.write_text(yaml.safe_dump(spec))
    for dry_run in ([], ["--dry-run"]):
        result = invoke_shoal("reindex", str(job), *dry_run)
        assert result.returncode == 2 and "is inside input" in result.stderr, result.stderr
        assert not (tmp_path / "data" / "index").exists()


@pytest.mark.parametrize(
    "source, output, expected",
    [
        ("s3://edges/data", "s3://edges/data/vectors", "is inside input"),
        ("s3://edges/data/", "s3a://edges/data/vectors/", "is inside input"),
        ("s3a://edges/data/*.parquet", "s3://edges/data/vectors", "is inside input"),
        ("s3://edges/data", "s3a://edges/data/", "is the input folder"),
        ("s3://edges/data", "s3://edges", "is inside output"),
    ],
)
def test_the_same_refusals_on_s3_whatever_the_scheme_spelling(
    s3_server, sim_catalog, tmp_path, source, output, expected
):
    options = s3_options(s3_server)
    fs = s3fs.S3FileSystem(**options)
    if not fs.exists("edges"):
        fs.mkdir("edges")
        write_shards(tmp_path / "data", ["a", "b"], shards=1, row_group_size=2)
        fs.put_file(str(tmp_path / "data" / "shard-000.parquet"), "edges/data/shard-000.parquet")
    before = sorted(fs.find("edges"))
    result = _embed(source, output, sim_catalog, "--storage-options", json.dumps(options))
    assert result.returncode == 2 and expected in result.stderr, result.stderr
    assert repr(source) in result.stderr and repr(output) in result.stderr
    fs.invalidate_cache()
    assert sorted(fs.find("edges")) == before


# -- vector options no part can hold --


@pytest.mark.parametrize("dim", ["4", "12"])
def test_binary_embed_with_a_dim_of_part_bytes_is_refused_before_any_cluster(sim_catalog, tmp_path, dim):
    write_shards(tmp_path / "data", ["a", "b"], shards=1, row_group_size=2)
    extra = ("--precision", "binary", "--dim", dim)
    result = invoke_shoal(
        *embed_args(tmp_path / "data", tmp_path / "out", sim_catalog, *extra, scheduler=UNREACHABLE, model="sim")
    )
    assert result.returncode == 2 and f"dim {dim} is not a multiple of 8" in result.stderr, result.stderr


# -- outputs that cannot be written, inputs that match nothing --


def test_an_output_that_cannot_be_written_is_refused_before_the_cluster_is_reached(
    tiny_catalog, test_profile, tmp_path
):
    source = write_rows(tmp_path / "in")
    (tmp_path / "a-file").write_text("x")
    pairs = tmp_path / "pairs.parquet"
    pq.write_table(pa.table({"id": [1], "query": ["q"], "passage": ["p"]}), pairs)
    common = ("--catalog", str(tiny_catalog), "--profile", str(test_profile), "--scheduler", UNREACHABLE)
    with read_only_folder(tmp_path / "ro") as ro:
        cases = {
            "read-only": (str(ro / "out"), "Read-only file system" if os.geteuid() == 0 else "Permission denied"),
            "a file": (str(tmp_path / "a-file"), "is a file"),
            "under a file": (str(tmp_path / "a-file" / "out"), "cannot be written"),
        }
        for case, (output, reason) in cases.items():
            for command in (
                ("embed", str(source), output, "--model", "tiny"),
                ("rerank", str(pairs), output, "--model", "tiny-reranker"),
            ):
                result = invoke_shoal(*command, *common)
                assert result.returncode == 2, (case, result.stderr)
                assert f"output {output!r}" in result.stderr and reason in result.stderr, (case, result.stderr)
                assert "cannot reach the scheduler" not in result.stderr
        job = tmp_path / "job.yaml"
        job.write_text(
            yaml.safe_dump(
                {
                    "name": "docs",
                    "input": str(source),
                    "output": str(ro / "out"),
                    "model": "tiny",
                    "catalog": str(tiny_catalog),
                    "scheduler": UNREACHABLE,
                }
            )
        )
        result = invoke_shoal("reindex", str(job))
        assert result.returncode == 2 and "cannot be written" in result.stderr, result.stderr
        pipeline = tmp_path / "pipeline.yaml"
        pipeline.write_text(
            yaml.safe_dump(
                {
                    "output": str(ro / "out"),
                    "corpus": {"input": str(source)},
                    "queries": {"input": str(source)},
                    "embed": {"model": "tiny"},
                }
            )
        )
        result = invoke_shoal("run", str(pipeline), *common)
        assert result.returncode == 2 and "cannot be written" in result.stderr, result.stderr
        assert "cannot reach the scheduler" not in result.stderr


def test_a_glob_matching_nothing_is_refused_before_the_cluster_is_reached(tiny_catalog, tmp_path):
    result = invoke_shoal(*embed_args(tmp_path / "*.parquet", tmp_path / "out", tiny_catalog, scheduler=UNREACHABLE))
    assert result.returncode == 2 and "matches no Parquet files" in result.stderr, result.stderr
