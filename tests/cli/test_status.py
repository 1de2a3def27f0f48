"""`shoal status`: jobs with item states per model, workers with the models they hold and have loaded, a reindexed output."""

from __future__ import annotations

import json

import yaml

from shoal.configs import load_catalog, load_profile
from shoal.configs.kinds import for_command
from shoal.pipeline.cluster import pull_queue
from shoal.pipeline.jobs.embed import EmbedRequest, embed_job
from shoal.pipeline.jobs.engine import model_for, plan_job
from tests.support.cli import invoke_shoal
from tests.support.files import write_shards
from tests.support.waiting import wait_for


def test_status_lists_jobs_per_model_and_workers(cluster, tiny_catalog, test_profile, demo_texts, tmp_path):
    _, client = cluster
    write_shards(tmp_path / "in", demo_texts[:400], shards=2, row_group_size=100)
    profile, catalog = load_profile(str(test_profile)), load_catalog(str(tiny_catalog))
    plan = plan_job(embed_job(EmbedRequest(str(tmp_path / "in"), str(tmp_path / "out"), "tiny")), profile)
    spec = model_for(catalog, profile, "tiny", for_command("embed"))
    client.sync(
        pull_queue(client).submit,
        job="status-probe",
        items=plan.items,
        options={"models": {"tiny": spec.model_dump()}},
    )
    try:
        wait_for(
            lambda: client.sync(pull_queue(client).job_status, job="status-probe")["complete"],
            timeout=120,
            what="status-probe complete",
            step=0.2,
        )
        raw = invoke_shoal("status", "--scheduler", client.scheduler.address, "--json")
        assert raw.returncode == 0, raw.stderr
        state = json.loads(raw.stdout)["cluster"]
        assert state["jobs"]["status-probe"]["models"] == {"tiny": {"done": len(plan.items)}}
        assert len(state["workers"]) == 2 and any("tiny" in w["loaded"] for w in state["workers"].values())

        table = invoke_shoal("status", "status-probe", "--scheduler", client.scheduler.address)
        assert table.returncode == 0, table.stderr
        assert "status-probe" in table.stdout and "tiny" in table.stdout and "400/400" in table.stdout
        worker = next(iter(state["workers"]))
        assert worker in table.stdout
    finally:
        client.sync(pull_queue(client).job_release, job="status-probe")
    none = invoke_shoal("status", "other-job", "--scheduler", client.scheduler.address)
    assert none.returncode == 0 and "no running job" in none.stdout
    missing = invoke_shoal("status")
    assert missing.returncode == 2 and "--scheduler" in missing.stderr


def test_status_of_a_job_file_shows_its_output(cluster, tiny_catalog, test_profile, demo_texts, tmp_path):
    _, client = cluster
    write_shards(tmp_path / "in", demo_texts[:200], shards=1, row_group_size=100)
    job = tmp_path / "docs.yaml"
    job.write_text(
        yaml.safe_dump(
            {
                "input": str(tmp_path / "in"),
                "output": str(tmp_path / "out"),
                "model": "tiny",
                "catalog": str(tiny_catalog),
                "profile": str(test_profile),
                "scheduler": client.scheduler.address,
                "lock": {"settle_seconds": 0},
            }
        )
    )
    assert invoke_shoal("reindex", str(job)).returncode == 0
    version = (tmp_path / "out" / "_CURRENT").read_text().strip()
    result = invoke_shoal("status", str(job), "--json")
    assert result.returncode == 0, result.stderr
    state = json.loads(result.stdout)
    assert state["output"]["current"] == version and state["output"]["versions"] == [version]
    assert state["output"]["lock"] is None and state["output"]["manifest"]["complete"]
    assert state["cluster"]["jobs"] == {}  # the reindex run finished and released its job
    shown = invoke_shoal("status", str(job))
    assert version in shown.stdout and "free" in shown.stdout and "1 run, 0 reused" in shown.stdout
