"""The last sharp edges (issue 25): blank model names, OUTPUT inside INPUT, the HTTP server's own errors,
and the accepted-today cases each decided.

The CLI refusals run `shoal` in this process against an unreachable scheduler: a refusal comes before any
cluster is reached (and before anything is written). The gateway tests start a real gateway on a real
pull queue (its scheduler faked, as in test_online_units.py) and talk to it over raw sockets, since no HTTP
client library sends requests this malformed.
"""

from __future__ import annotations

import pytest
import yaml
from conftest import embed_args, invoke_shoal, reindex_job, write_shards

UNREACHABLE = "tcp://127.0.0.1:9"  # a refusal that comes first never gets as far as this scheduler
SIM = {"kind": "sim", "dim": 16, "max_seq_length": 64, "memory_bytes": 1000}


@pytest.fixture
def sim_catalog(tmp_path):
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump({"models": {"sim": SIM}}))
    return path


# -- 1. blank model names -----------------------------------------------------------------------


def _model_options() -> list[tuple[str, str, int]]:
    """(command, option, its required arguments) for every option of every command that names models."""
    from pipeline.cli import main

    found = []
    for name, command in sorted(main.commands.items()):
        arguments = sum(isinstance(p, __import__("click").Argument) and p.required for p in command.params)
        found += [
            (name, option, arguments)
            for p in command.params
            for option in p.opts
            if option in ("--model", "--models", "--reranker")
        ]
    return found


def test_every_command_naming_models_is_checked():
    assert {(c, o) for c, o, _ in _model_options()} == {
        ("check-precision", "--model"),
        ("embed", "--model"),
        ("eval", "--model"),
        ("eval", "--reranker"),
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


# -- 2. OUTPUT inside INPUT -----------------------------------------------------------------------


def _embed(source, output, catalog):
    return invoke_shoal(*embed_args(source, output, catalog, scheduler=UNREACHABLE, model="sim"))


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
    from pipeline.jobs.engine import preflight

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
