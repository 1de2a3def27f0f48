"""A live page on the Dask dashboard: /shoal, and its figures as JSON at /shoal/figures.json.

Routes are added to the scheduler's own HTTP server (the one serving Dask's
dashboard and /metrics), so a cluster has one place to look, with no extra
port or process. The page is rendered on the server from ShoalMetrics'
figures, so it shows live numbers even to a client without JavaScript; a few
lines of script swap in a fresh rendering every second.
"""

from __future__ import annotations

import datetime as dt
import json
from html import escape

from tornado import web

from .metrics import RATE_WINDOW_SECONDS, Figures, ShoalMetrics
from .protocol import ScalingStatus

REFRESH_MS = 1000
PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Shoal: {address}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #1d2430; background: #f7f8fa; }}
h1 {{ font-size: 1.4em; margin: 0 0 .2em; }} h2 {{ font-size: 1.1em; margin: 1.4em 0 .4em; }}
.sub {{ color: #5b6473; }}
.tiles {{ display: flex; gap: .8em; flex-wrap: wrap; margin-top: 1em; }}
.tile {{ background: #fff; border: 1px solid #dde1e7; border-radius: 6px; padding: .6em 1em; min-width: 9em; }}
.tile b {{ display: block; font-size: 1.6em; }}
table {{ border-collapse: collapse; background: #fff; border: 1px solid #dde1e7; }}
th, td {{ padding: .35em .8em; text-align: right; border-bottom: 1px solid #eef0f3; }}
th {{ background: #eef1f5; }} td:first-child, th:first-child {{ text-align: left; }}
.bar {{ display: inline-block; height: .8em; background: #4c78a8; vertical-align: middle; margin-left: .4em; }}
.online {{ background: #e45756; }} .none {{ color: #8a93a2; }}
</style></head>
<body><main id="shoal">{body}</main>
<script>
setInterval(async () => {{
  const r = await fetch(location.pathname + "?fragment=1", {{cache: "no-store"}});
  if (r.ok) document.getElementById("shoal").innerHTML = await r.text();
}}, {refresh});
</script></body></html>
"""


def render(figures: Figures, address: str) -> str:
    """The page's body: tiles, then queues and throughput per model, workers, batch jobs, events."""
    models, workers, jobs = figures["models"], figures["workers"], figures["jobs"]
    now = dt.datetime.now().strftime("%H:%M:%S")
    rate = sum(m["rows_per_second"] for m in models.values())
    tiles = [
        ("batch queued", sum(m["batch"] for m in models.values())),
        ("online queued", sum(m["online"] for m in models.values())),
        ("leased", sum(w["leased"] for w in workers.values())),
        ("rows/s", f"{rate:,.1f}"),
        ("workers", len(workers)),
        ("online unanswered", sum(m["online_pending"] for m in models.values())),
        ("running jobs", sum(1 for j in jobs.values() if not j["complete"])),
        ("target workers", figures["scaling"]["target"]),
    ]
    out = [
        f"<h1>Shoal</h1><div class='sub'>scheduler {escape(address)} &middot; updated {now} &middot; "
        f"throughput over the last {RATE_WINDOW_SECONDS:g} s</div>",
        "<div class='tiles'>" + "".join(f"<div class='tile'>{escape(k)}<b>{v}</b></div>" for k, v in tiles) + "</div>",
        _scaling(figures["scaling"]),
    ]
    deepest = max([m["batch"] + m["online"] for m in models.values()] + [1])
    rows = [
        [
            escape(name),
            f"{m['online']:,}{_bar(m['online'], deepest, 'online')}",
            f"{m['online_pending']:,}",
            f"{m['batch']:,}{_bar(m['batch'], deepest)}",
            f"{m['rows_per_second']:,.1f}",
            f"{m['rows_done']:,.0f}",
            f"{m['rows_done'] / m['compute_seconds']:,.1f}" if m["compute_seconds"] else "-",
        ]
        for name, m in models.items()
    ]
    out.append(
        _table(
            "Queues and throughput per model",
            [
                "model",
                "online queued",
                "online unanswered",
                "batch queued",
                "rows/s",
                "rows done",
                "rows per compute s",
            ],
            rows,
        )
    )
    rows = [
        [
            escape(address),
            f"{w['leased']:,}",
            ", ".join(escape(m) for m in w["loaded"]) or "<span class='none'>none</span>",
            _bytes(w["budget"]),
            _bytes(w["free_bytes"]),
            f"{w['loads']:,}",
            f"{w['evictions']:,}",
        ]
        for address, w in sorted(workers.items())
    ]
    out.append(
        _table("Workers", ["worker", "leased", "loaded models", "model budget", "free", "loads", "evictions"], rows)
    )
    rows = [
        [
            escape(job_id),
            f"{j['rows_done']:,} / {j['rows_total']:,}{_bar(j['rows_done'], max(j['rows_total'], 1))}",
            f"{j['done']:,} / {j['items']:,}",
            f"{j['failed']:,}",
            f"{j['elapsed']:,.1f}",
            "complete" if j["complete"] else "running",
        ]
        for job_id, j in sorted(jobs.items())
    ]
    out.append(_table("Batch jobs", ["job", "rows", "parts", "failed", "seconds", "state"], rows))
    events = figures["counts"]
    out.append(_table("Queue events", sorted(events), [[f"{events[k]:,}" for k in sorted(events)]]))
    return "\n".join(out)


def _scaling(scaling: ScalingStatus) -> str:
    """One line: the target autoscalers are told, the workers now, the reason, and whether any asks."""
    asked = scaling["asked_seconds_ago"]
    by = f"asked {asked:.0f} s ago" if asked is not None else "no autoscaler asks (a fixed cluster)"
    return (
        f"<div class='sub'>scaling: target {scaling['target']} workers, {scaling['current']} now &middot; "
        f"{escape(scaling['reason'])} &middot; {by}</div>"
    )


def _table(title: str, header: list[str], rows: list[list[str]]) -> str:
    if not rows or not header:
        return f"<h2>{escape(title)}</h2><div class='none'>none yet</div>"
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<h2>{escape(title)}</h2><table><tr>{head}</tr>{body}</table>"


def _bar(value: float, full: float, kind: str = "") -> str:
    width = 0 if not value else max(2, round(120 * value / full))
    return f"<span class='bar {kind}' style='width:{width}px'></span>"


def _bytes(value: int | None) -> str:
    return "-" if value is None else f"{value / 1e9:,.2f} GB"


class ShoalPage(web.RequestHandler):
    def initialize(self, metrics: ShoalMetrics) -> None:
        self.metrics = metrics

    def get(self) -> None:
        address = self.metrics.queue.scheduler.address
        body = render(self.metrics.figures(), address)
        self.set_header("Cache-Control", "no-store")
        if self.get_argument("fragment", None):
            self.write(body)
        else:
            self.write(PAGE.format(address=escape(address), body=body, refresh=REFRESH_MS))


class ShoalFigures(web.RequestHandler):
    def initialize(self, metrics: ShoalMetrics) -> None:
        self.metrics = metrics

    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.write(json.dumps(self.metrics.figures(), default=float))


def start_dashboard(scheduler, metrics: ShoalMetrics) -> None:
    """Add /shoal and /shoal/figures.json to the scheduler's dashboard server."""
    application = getattr(scheduler, "http_application", None)
    if application is None:  # a scheduler started without its HTTP server
        return
    application.add_handlers(
        r".*",
        [(r"/shoal/?", ShoalPage, {"metrics": metrics}), (r"/shoal/figures\.json", ShoalFigures, {"metrics": metrics})],
    )
