"""The live view: /shoal on the Dask dashboard and Shoal's figures on Dask's /metrics, over real HTTP.

A job runs on the module's two-worker cluster while the page and the metrics
are fetched, so the numbers checked are live ones, not a rendering of fakes.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request

import pytest
from rich.console import Console

from tests.support.files import write_shards

MODEL = "tiny"


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        return response.read().decode()


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample of the Prometheus text format, or None."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0])) if "{" in line else {}
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.fixture(scope="module")
def running_job(cluster, tmp_path_factory, demo_texts, test_profile, tiny_catalog):
    """A job over the demo corpus, running in a thread while the tests look."""
    from shoal.configs import load_catalog, load_profile
    from shoal.pipeline.jobs.embed import EmbedRequest, run_embed

    local, client = cluster
    folder = tmp_path_factory.mktemp("dashboard")
    # Four passes over the demo corpus: the job must outlast a few heartbeats, however warm the workers are.
    write_shards(folder / "in", demo_texts * 4, shards=8, row_group_size=100)
    request = EmbedRequest(str(folder / "in"), str(folder / "out"), MODEL)
    profile, catalog = load_profile(str(test_profile)), load_catalog(str(tiny_catalog))
    outcome: dict = {}
    thread = threading.Thread(
        target=lambda: outcome.update(result=run_embed(client, request, profile, catalog, Console(quiet=True))),
        daemon=True,
    )
    thread.start()
    base = f"http://127.0.0.1:{local.scheduler.http_server.port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until rows are flowing and workers have reported their loads
        figures = json.loads(get(base + "/shoal/figures.json"))
        model = figures["models"].get(MODEL, {})
        loads = sum(w["loads"] for w in figures["workers"].values())
        if model.get("rows_done", 0) > 0 and model.get("rows_per_second", 0) > 0 and loads >= 1 and figures["jobs"]:
            break
        time.sleep(0.2)
    assert figures["jobs"], "the job ended before the dashboard showed it running"
    yield base, figures
    thread.join(timeout=300)
    assert outcome["result"].exit_code == 0


def test_page_shows_live_queue_workers_and_throughput(running_job):
    base, figures = running_job
    html = get(base + "/shoal")
    assert html.startswith("<!doctype html>")
    for heading in ("Queues and throughput per model", "Workers", "Batch jobs", "Queue events"):
        assert heading in html
    assert f"<td>{MODEL}</td>" in html
    for address in figures["workers"]:
        assert address in html
    assert any(MODEL in w["loaded"] for w in figures["workers"].values())
    job_id = next(iter(figures["jobs"]))
    assert job_id in html
    rate = re.search(r"rows/s<b>([\d,.]+)</b>", html)
    assert rate is not None and float(rate.group(1).replace(",", "")) > 0
    fragment = get(base + "/shoal?fragment=1")  # what the page's script swaps in every second
    assert "<html" not in fragment and "Workers" in fragment


def test_dask_metrics_endpoint_carries_shoal_figures(running_job):
    base, figures = running_job
    text = get(base + "/metrics")
    assert "dask_scheduler_workers" in text  # Dask's own collectors, same registry
    assert metric(text, "shoal_rows_total", model=MODEL) > 0
    assert metric(text, "shoal_queue_depth", model=MODEL, lane="batch") is not None
    assert metric(text, "shoal_queue_events_total", event="leased") > 0
    workers = list(figures["workers"])
    assert sum(metric(text, "shoal_model_loads_total", worker=w) or 0 for w in workers) >= 1
    assert any(metric(text, "shoal_loaded_model", worker=w, model=MODEL) == 1 for w in workers)
    assert all(metric(text, "shoal_model_budget_bytes", worker=w) > 0 for w in workers)
    assert metric(text, "shoal_jobs", state="running") is not None
    assert metric(text, "shoal_online_pending", model=MODEL) == 0  # no online load in this test
