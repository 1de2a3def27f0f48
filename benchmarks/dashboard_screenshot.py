#!/usr/bin/env python
"""Screenshot of the live /shoal page in headless Chromium while a job runs.

Starts an embedded cluster with the given profile, starts the online gateway
with a light open-loop load on it, runs an embed job over the demo corpus,
and once rows are flowing (and every worker has reported its model loads)
points headless Chromium at the scheduler's /shoal page:

    .venv/bin/python benchmarks/dashboard_screenshot.py            # -> docs/dashboard.png
    .venv/bin/python benchmarks/dashboard_screenshot.py --profile cpu-2core --out /tmp/d.png

Needs a Chromium binary (`apt-get install -y chromium` on Debian); the test
suite checks the same page over HTTP without one (tests/scheduler/test_dashboard.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

from distributed import Client
from harness import ROOT  # before Shoal's imports: the repository on sys.path, the workers' environment defaults
from rich.console import Console

from shoal.configs import GatewaySettings, load_catalog, load_profile
from shoal.configs.kinds import for_operation
from shoal.pipeline.cluster import pull_queue, start_local_cluster
from shoal.pipeline.jobs.embed import EmbedRequest, run_embed
from shoal.pipeline.jobs.engine import model_for
from shoal.pipeline.tuning.probe import OnlineProbe
from shoal.pipeline.tuning.sample import draw_sample

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def browser() -> str:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    raise SystemExit(f"no Chromium found (tried {', '.join(BROWSERS)}); on Debian: apt-get install -y chromium")


def figures(base: str) -> dict:
    with urllib.request.urlopen(base + "/shoal/figures.json", timeout=10) as response:
        return json.loads(response.read())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default=None, help="profile name or YAML (default: cpu-local)")
    p.add_argument("--model", default="minilm")
    p.add_argument("--input", default=str(ROOT / "datasets" / "demo"))
    p.add_argument("--online-rate", type=float, default=2.0, help="online requests/s during the job (0: none)")
    p.add_argument("--out", default=str(ROOT / "docs" / "dashboard.png"))
    p.add_argument("--size", default="1280,1000", help="window width,height")
    p.add_argument("--wait", type=float, default=6.0, help="seconds of flowing rows before the shot")
    args = p.parse_args()
    chromium = browser()
    profile, catalog = load_profile(args.profile), load_catalog()
    scratch = Path(tempfile.mkdtemp(prefix="shoal-shot-"))
    result: dict = {}
    with ExitStack() as stack:
        cluster = stack.enter_context(start_local_cluster(profile))
        client = stack.enter_context(Client(cluster))
        client.wait_for_workers(profile.workers)
        base = f"http://127.0.0.1:{cluster.scheduler.http_server.port}"
        request = EmbedRequest(args.input, str(scratch / "out"), args.model)
        job = threading.Thread(
            target=lambda: result.update(outcome=run_embed(client, request, profile, catalog, Console(quiet=True))),
            daemon=True,
        )
        job.start()
        if args.online_rate:  # online requests too, so the page's online figures are live
            specs = {args.model: model_for(catalog, profile, args.model, for_operation("embed")).model_dump()}
            url = client.sync(
                pull_queue(client).gateway_start, settings=GatewaySettings(port=0).model_dump(), models=specs
            )["url"]
            texts = draw_sample(args.input, 256, scratch / "sample").texts
            stack.enter_context(OnlineProbe(url, args.model, texts, args.online_rate))
        flowing = None
        while job.is_alive():
            f = figures(base)
            loads = sum(w["loads"] for w in f["workers"].values())
            if f["models"].get(args.model, {}).get("rows_per_second", 0) > 0 and loads >= profile.workers:
                flowing = flowing or time.monotonic()
                if time.monotonic() - flowing >= args.wait:
                    break
            time.sleep(0.5)
        if not job.is_alive():
            raise SystemExit("the job ended before the page showed flowing rows; use a bigger --input")
        out = Path(args.out).resolve()
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="shoal-chromium-") as home:
            subprocess.run(
                [
                    chromium,
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--hide-scrollbars",
                    f"--user-data-dir={home}",
                    f"--window-size={args.size}",
                    f"--screenshot={out}",
                    "--virtual-time-budget=3000",
                    base + "/shoal",
                ],
                check=True,
                capture_output=True,
                timeout=120,
            )
        shown = figures(base)
        job.join()
    shutil.rmtree(scratch, ignore_errors=True)
    rate = sum(m["rows_per_second"] for m in shown["models"].values())
    print(
        f"wrote {out} ({out.stat().st_size:,} bytes) while the job ran at {rate:,.1f} rows/s; "
        f"job exit code {result['outcome'].exit_code}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
