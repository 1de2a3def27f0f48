"""`shoal tune`: measure this machine and write a profile for it.

Two phases, each a coordinate search (pipeline/tuning/search.py) that needs
far fewer trials than the full grid:

1. per model, token budget x batch cap, timed in this process on the worker's
   own runtime (`EmbedderTrials`, pipeline/tuning/trials.py): seconds a trial;
2. for the models together, worker processes x threads, prefetch depth, and
   when measured, item size (it bounds online latency: a worker computes a
   whole item before an online request can take the device) and models per
   device: embed jobs on embedded clusters (`ClusterTrials`, same module)
   with phase 1's budgets, an online load on the gateway meanwhile.

The best configuration keeps the online p99 target (if there is one) and
fits the memory cap; among those, the highest batch rows/s wins. On CPU the
p99 is measured and recorded but not a target unless asked for: batch and
online requests share the same few cores there, so a tight target can only
be bought with batch throughput, and that trade is the operator's to make.
Phase 1 may use PHASE1_SHARE of the time budget; no trial starts that would
likely end past the deadline.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import os
import platform
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import psutil
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ...configs import Catalog, Profile, load_catalog, load_profile
from ...configs.kinds import kind_of
from ..jobs.image_files import images_per_item
from . import REPO_ROOT
from .profile import profile_fields, profile_path, write_profile
from .quality_gate import JUDGED_SET
from .runtimes import RuntimeSearch, choose_runtime, retime
from .sample import draw_sample
from .search import Config, CoordinateSearch, Dimension, Outcome, SearchResult, Trial
from .trials import ClusterTrials, EmbedderTrials, ImageTrials

DEMO_INPUT = str(REPO_ROOT / "datasets" / "demo")
PHASE1_SHARE = 0.3
CLUSTER_TRIAL_SECONDS = 30.0  # a cluster trial's job: its sample is sized by phase 1's rate to last about this
MIN_CLUSTER_ROWS = 256
MODEL_HEADROOM = 1.25  # a held model's budget share over its weights: buffers, allocator slack
SHARED_MACHINE = 0.10  # other processes above this share of the cores: the figures are preliminary


@dataclass(frozen=True)
class Grid:
    """Phase 1's values of each knob on one kind of device, and its default online p99 target."""

    token_budget: tuple[int, ...]
    max_batch_size: tuple[int, ...]
    p99_ms: float | None
    image_batch: tuple[int, ...] = ()  # an image model's images per forward


IMAGE_SAMPLE = 128  # drawn JPEGs an image model's phase 1 embeds per trial


GRIDS = {
    "cpu": Grid(
        token_budget=(1024, 2048, 4096, 8192, 16384, 32768),
        max_batch_size=(16, 32, 64, 128, 256, 512),
        p99_ms=None,  # measured, not a target: see the module docstring
        image_batch=(4, 8, 16, 32, 64),
    ),
    "cuda": Grid(
        token_budget=(8192, 16384, 32768, 65536, 131072, 262144, 524288),
        max_batch_size=(64, 128, 256, 512, 1024, 2048, 4096),
        p99_ms=200.0,
        image_batch=(32, 64, 128, 256, 512, 1024),
    ),
}
PREFETCH = (1, 2, 3, 4)
ROWS_PER_ITEM = (64, 128, 256, 512, 1024, 2048)


@dataclass
class TuneRequest:
    profile: str  # name (configs/NAME.yaml) or path of the profile to write
    models: list[str]
    budget_minutes: float = 10.0
    input: str = DEMO_INPUT
    text_column: str = "text"
    catalog: str | None = None
    base: str | None = None  # start from this profile; default: NAME if it exists, else the default
    sample_rows: int = 2048  # at most, per cluster trial; fewer on a slow machine (CLUSTER_TRIAL_SECONDS)
    embed_rows: int = 256
    online_rate: float = 2.0  # requests/s during cluster trials; 0: batch only
    p99_ms: float | None = None  # online p99 target; default by device kind (GRIDS)
    min_gain: float = 0.03
    max_memory_fraction: float = 0.5


class TrialRow(TypedDict, total=False):
    """A row of tune's table: one trial."""

    phase: str
    trial: Trial
    config: str  # as printed
    vs_start: float  # times the phase's first trial's score
    chosen: bool


@dataclass
class TuneReport:
    path: Path
    profile: Profile
    rows: list[TrialRow] = field(default_factory=list)  # every trial, for the table
    seconds: float = 0.0
    trials: int = 0
    grid: int = 0


class Tuner:
    def __init__(self, request: TuneRequest, console: Console) -> None:
        self.request = request
        self.console = console
        self.path = profile_path(request.profile)
        base_name = request.base or (str(self.path) if self.path.exists() else None)
        self.base = load_profile(base_name)
        self.catalog: Catalog = load_catalog(request.catalog)
        for name in request.models:
            self.catalog.get(name)
        self.began = time.monotonic()
        self.deadline = self.began + request.budget_minutes * 60
        self.rows: list[TrialRow] = []
        self.other_cpu: list[float] = []

    def run(self) -> TuneReport:
        from ...workers.devices import apply_torch_threads, detect_device

        plan = detect_device(self.base, {})
        apply_torch_threads(plan)
        grid = GRIDS[plan.kind]
        p99_ms = self.request.p99_ms or grid.p99_ms
        scratch = Path(tempfile.mkdtemp(prefix="shoal-tune-"))
        columns = (
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[trials]} trials"),
            TimeElapsedColumn(),
            TextColumn("of {task.fields[budget]}"),
        )
        try:
            sample = draw_sample(
                self.request.input, self.request.embed_rows, scratch / "sample", self.request.text_column
            )
            with Progress(*columns, console=self.console, transient=True) as progress:
                self.progress = progress
                self.task = progress.add_task(
                    "sampling",
                    total=self.deadline - self.began,
                    trials=0,
                    budget=f"{self.request.budget_minutes:g} min",
                )
                phase0 = self._phase0(plan, sample.texts)
                self.base = self.base.model_copy(
                    update={"runtimes": {**self.base.runtimes, **{m: r.choice for m, r in phase0.items()}}}
                )
                tuned, sizes, phase1 = self._phase1(plan, grid, sample.texts)
                base = self.base.model_copy(
                    update={
                        "token_budgets": {
                            **self.base.token_budgets,
                            **{m: c["token_budget"] for m, c in tuned.items() if "token_budget" in c},
                        },
                        "max_batch_sizes": {
                            **self.base.max_batch_sizes,
                            **{m: c["max_batch_size"] for m, c in tuned.items() if "max_batch_size" in c},
                        },
                        "image_batches": {
                            **self.base.image_batches,
                            **{m: c["image_batch"] for m, c in tuned.items() if "image_batch" in c},
                        },
                    }
                )
                memory = plan.memory_budget / self.base.memory_fraction  # host RAM or device memory, per worker
                fractions = self._fractions(sizes, memory)
                slowest = min(s.best.outcome.figures["rows_per_s"] or 0.0 for s in phase1.values())
                rate = slowest / len(self.request.models)
                rows = int(
                    min(self.request.sample_rows, max(MIN_CLUSTER_ROWS, rate * CLUSTER_TRIAL_SECONDS)) // 64 * 64
                )
                self._describe(f"sampling {rows} rows for cluster trials")
                cluster_sample = draw_sample(
                    self.request.input, rows, scratch / "cluster-sample", self.request.text_column
                )
                trials = ClusterTrials(
                    base,
                    self.catalog,
                    self.request.catalog,
                    self.request.models,
                    cluster_sample,
                    scratch,
                    fractions,
                    self.request.online_rate,
                    p99_ms,
                )
                try:
                    phase2 = self._phase2(trials, base, plan, fractions)
                finally:
                    trials.close()
                threads = trials.profile_fields(phase2.best.config)["threads_per_worker"]
                if threads != plan.threads:
                    phase0 = self._retime_phase0(phase0, dataclasses.replace(plan, threads=threads), sample.texts)
            fields = {**profile_fields(base), **trials.profile_fields(phase2.best.config)}
            if phase0:
                fields["runtimes"] = {
                    **fields.get("runtimes", {}),
                    **{m: r.choice.model_dump(exclude_none=True) for m, r in phase0.items()},
                }
            fields["name"] = self.path.stem
            comments = self._comments(plan, sample, cluster_sample, phase1, phase2, fractions, sizes, memory, p99_ms)
            comments[comments.index("") + 1 : comments.index("") + 1] = self._phase0_comments(phase0)
            profile = write_profile(self.path, fields, comments)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        searches = [*phase1.values(), phase2]
        report = TuneReport(
            self.path,
            profile,
            self.rows,
            time.monotonic() - self.began,
            sum(len(s.trials) for s in searches),
            sum(s.grid_size for s in searches),
        )
        self.console.print(self._table())
        self.console.print(
            f"{report.trials} trials in {report.seconds:.0f} s (the full grids: {report.grid}); wrote {self.path}",
            highlight=False,
        )
        return report

    # -- the phases ----------------------------------------------------------

    def _phase0(self, plan, texts: list[str]) -> dict[str, RuntimeSearch]:
        """Per model of a kind with several runtimes (embedders, rerankers): the fastest runtime x dtype the quality
        gate accepts (pipeline/tuning/runtimes.py)."""
        searches: dict[str, RuntimeSearch] = {}
        for name in self.request.models:
            spec = self.base.tuned(self.catalog.get(name))
            if not kind_of(spec).measured:
                continue
            self._describe(f"phase 0 {name}: runtime x dtype under the quality gate")
            searches[name] = choose_runtime(spec, plan, texts, self.request.min_gain, JUDGED_SET)
            for line in searches[name].lines(name):
                self.progress.console.print(line, highlight=False)
        return searches

    def _retime_phase0(self, phase0: dict[str, RuntimeSearch], plan, texts: list[str]) -> dict[str, RuntimeSearch]:
        """Phase 0's speeds again at the layout phase 2 chose (threads per worker change which runtime wins)."""
        retimed = {}
        for name, search in phase0.items():
            self._describe(f"phase 0 {name}: re-timed at {plan.threads} thread(s) per worker")
            retimed[name] = retime(search, self.base.tuned(self.catalog.get(name)), plan, texts, self.request.min_gain)
            for line in retimed[name].lines(name):
                self.progress.console.print(line, highlight=False)
        return retimed

    def _phase0_comments(self, phase0: dict[str, RuntimeSearch]) -> list[str]:
        if not phase0:
            return []
        lines = [
            "Phase 0, per model: runtime x dtype. Each candidate judged by the quality gate against fp32 torch on",
            "the sample (cosine mean >= 0.999, min >= 0.99; nDCG@10 on datasets/pydoc-sections within 0.005), then",
            "those that pass timed in back-to-back pairs with fp32 torch (median of the pairs' ratios):",
        ]
        for name, search in phase0.items():
            lines.extend(search.lines(name))
        return lines

    def _phase1(
        self, plan, grid: Grid, texts: list[str]
    ) -> tuple[dict[str, dict], dict[str, int], dict[str, SearchResult]]:
        """Per model: the best (token budget, batch cap); measured sizes; the searches."""
        tuned: dict[str, dict] = {}
        sizes: dict[str, int] = {}
        searches: dict[str, SearchResult] = {}
        share = (self.deadline - self.began) * PHASE1_SHARE / len(self.request.models)
        for name in self.request.models:
            spec = self.base.tuned(self.catalog.get(name))
            self._describe(f"loading {name}")
            trials: EmbedderTrials | ImageTrials
            if "images" in kind_of(spec).inputs:  # images per forward, on drawn JPEGs
                start: Config = {"image_batch": spec.images_for(plan.kind)}
                rows = images_per_item(self.base.rows_per_item)
                trials = ImageTrials(spec, plan, IMAGE_SAMPLE, rows, reference=start)
                dims = [Dimension("image_batch", grid.image_batch)]
            else:
                start = {"token_budget": spec.budget_for(plan.kind), "max_batch_size": spec.max_batch_size}
                trials = EmbedderTrials(spec, plan, texts, self.base.rows_per_item, reference=start)
                dims = [
                    Dimension("token_budget", grid.token_budget),
                    Dimension("max_batch_size", grid.max_batch_size),
                ]
            try:
                search = CoordinateSearch(
                    dims,
                    start,
                    self._labelled(trials, f"1 {name}"),
                    self.request.min_gain,
                    deadline=min(self.deadline, time.monotonic() + share),
                    on_trial=self._recorder(f"1 {name}"),
                )
                searches[name] = search.run()
                sizes[name] = trials.memory_bytes
            finally:
                trials.close()
            tuned[name] = dict(searches[name].best.config)
        return tuned, sizes, searches

    def _phase2(self, trials: ClusterTrials, base: Profile, plan, fractions: dict[int, float]) -> SearchResult:
        cores = _cores()
        if plan.kind == "cpu":
            layouts = tuple((w, cores // w) for w in range(1, cores + 1) if cores % w == 0)
        else:  # processes sharing one GPU: they overlap each other's tokenizing and Python
            layouts = tuple((w, max(1, cores // w)) for w in (1, 2, 3, 4))
        dims: list[Dimension] = []
        start: Config = {}
        if self.request.online_rate and trials.p99_target_ms:  # first: it decides which keep the p99 target
            item_sizes = tuple(r for r in ROWS_PER_ITEM if r <= len(trials.sample.texts) // 2) or ROWS_PER_ITEM[:1]
            dims.append(Dimension("rows_per_item", item_sizes))  # at least two items, so two workers can share
            start["rows_per_item"] = min(base.rows_per_item, item_sizes[-1])
        dims += [Dimension("layout", layouts), Dimension("prefetch", PREFETCH)]
        start.update({"layout": (base.workers, plan.threads), "prefetch": base.prefetch})
        if len(fractions) > 1:
            dims.append(Dimension("models_per_device", tuple(sorted(fractions))))
            start["models_per_device"] = max(fractions)
        search = CoordinateSearch(
            dims,
            start,
            self._labelled(trials, "2 cluster"),
            self.request.min_gain,
            deadline=self.deadline,
            on_trial=self._recorder("2 cluster"),
        )
        return search.run()

    def _fractions(self, sizes: dict[str, int], memory: float) -> dict[int, float]:
        """memory_fraction per worker that lets it hold k of the models, for each k under the cap."""
        largest = max(sizes.values())
        fractions = {}
        for k in range(1, len(sizes) + 1):
            fraction = math.ceil(k * largest * MODEL_HEADROOM / memory * 1000) / 1000
            if fraction <= self.request.max_memory_fraction:
                fractions[k] = max(fraction, 0.001)
        if not fractions:
            raise ValueError(
                f"not even one model fits in {self.request.max_memory_fraction:.0%} of this device's memory"
            )
        if len(sizes) == 1:  # nothing to trade: keep the base profile's room for models
            return {1: self.base.memory_fraction}
        return fractions

    # -- progress, table, comments ------------------------------------------

    def _describe(self, text: str) -> None:
        self.progress.update(self.task, description=text, completed=time.monotonic() - self.began)

    def _labelled(self, objective, phase: str):
        def measure(config: dict) -> Outcome:
            self._describe(f"phase {phase}: {_config_text(config)}")
            return objective(config)

        return measure

    def _recorder(self, phase: str):
        def record(trial: Trial) -> None:
            other_cpu = trial.outcome.figures.get("other_cpu")
            if other_cpu is not None:
                self.other_cpu.append(other_cpu)
            first = next((row["trial"] for row in self.rows if row["phase"] == phase), trial)
            vs_start = trial.outcome.figures.get("vs_start") or trial.outcome.score / max(first.outcome.score, 1e-9)
            self.rows.append(
                {"phase": phase, "trial": trial, "config": _config_text(trial.config), "vs_start": vs_start}
            )
            self.progress.update(self.task, trials=len(self.rows), completed=time.monotonic() - self.began)
            self.progress.console.print(
                f"  {phase} #{trial.index} {_config_text(trial.config)}: {_figures_text(trial)}", highlight=False
            )

        return record

    def _table(self) -> Table:
        table = Table(title=f"shoal tune: {len(self.rows)} trials")
        for column in (
            "phase",
            "#",
            "configuration",
            "rows/s",
            "vs start",
            "p99 ms",
            "padding",
            "other CPU",
            "keeps limits",
            "s",
            "chosen",
        ):
            table.add_column(column)
        chosen = {id(row["trial"]) for row in self.rows if row.get("chosen")}
        for row in self.rows:
            trial: Trial = row["trial"]
            f = trial.outcome.figures
            table.add_row(
                row["phase"],
                str(trial.index),
                row["config"],
                f"{f.get('rows_per_s', 0):.1f}",
                f"{row['vs_start']:.2f}x",
                _or_dash(f.get("p99_ms")),
                _percent(f.get("padding")),
                _percent(f.get("other_cpu")),
                "yes" if trial.outcome.feasible else f"no {trial.outcome.note}".strip(),
                f"{trial.seconds:.0f}",
                "*" if id(trial) in chosen else "",
            )
        return table

    def _comments(self, plan, sample, cluster_sample, phase1, phase2, fractions, sizes, memory, p99_ms) -> list[str]:
        for search in [*phase1.values(), phase2]:
            for row in self.rows:
                if row["trial"] is search.best:
                    row["chosen"] = True
        busiest = max(self.other_cpu, default=0.0)
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
        lines = [
            f"TUNED by `shoal tune --profile {self.request.profile} --models {','.join(self.request.models)} "
            f"--budget-minutes {self.request.budget_minutes:g}` on {now}.",
            f"Machine: {_machine(plan)}.",
            f"Samples drawn (seed 0) from {_shown(self.request.input)}: embedder trials on "
            f"{len(sample.texts)} texts; cluster trials on "
            f"{len(cluster_sample.texts)} texts (phase 1's rate x {CLUSTER_TRIAL_SECONDS:g} s, at most "
            f"{self.request.sample_rows}). Layouts read as workers x threads per worker.",
        ]
        if busiest > SHARED_MACHINE:
            lines.append(
                f"PRELIMINARY: other processes used up to {busiest:.0%} of the cores during trials (shared machine); "
                "re-run on a quiet machine (`make tune`)."
            )
        lines.append("")
        lines.append(
            "Phase 1, per model: token budget x batch cap, in-process on the worker's runtime of phase 0's choice; each trial"
        )
        lines.append("timed in alternation with the start configuration (vs start: ratio of best runs, drift-proof):")
        for name, search in phase1.items():
            first, best = search.trials[0], search.best
            lines.append(
                f"  {name}: start {_config_text(first.config)} {first.outcome.figures['rows_per_s']:.1f} rows/s -> chosen "
                f"{_config_text(best.config)} {best.outcome.figures['rows_per_s']:.1f} rows/s, "
                f"{best.outcome.score:.2f}x the start timed beside it; {len(search.trials)} trials of a "
                f"{search.grid_size} grid, {search.stopped}."
            )
        first, best = phase2.trials[0], phase2.best
        target = f"p99 target {p99_ms:g} ms" if p99_ms else "p99 measured, no target (--p99-ms sets one)"
        online = (
            f"online load {self.request.online_rate:g} req/s on the gateway, {target}"
            if self.request.online_rate
            else "batch only (no online load measured)"
        )
        lines.append(f"Phase 2: cluster layout, embed jobs over the sample on embedded clusters, {online}:")
        lines.append(f"  start {_config_text(first.config)}: {_figures_text(first)}")
        lines.append(
            f"  chosen {_config_text(best.config)}: {_figures_text(best)} "
            f"({best.outcome.score / max(first.outcome.score, 1e-9):.2f}x the start, timed apart)"
        )
        lines.append(f"  {len(phase2.trials)} trials of a {phase2.grid_size} grid, {phase2.stopped}.")
        if len(sizes) > 1:
            lines.append(f"  models per device -> memory_fraction: {fractions} (per worker, of {memory / 1e9:.1f} GB)")
        lines.append("Every trial:")
        for row in self.rows:
            trial = row["trial"]
            mark = " <- chosen" if row.get("chosen") else ""
            lines.append(
                f"  {row['phase']} #{trial.index} {row['config']}: {_figures_text(trial)}, "
                f"{row['vs_start']:.2f}x start{mark}"
            )
        lines.append("")
        return lines


def tune(request: TuneRequest, console: Console) -> TuneReport:
    return Tuner(request, console).run()


def _shown(url: str) -> str:
    """`url` as a profile's header names it: relative to the checkout when inside it, so no machine's path."""
    if "://" in url:
        return url
    try:
        return str(Path(url).resolve().relative_to(REPO_ROOT))
    except ValueError:
        return url


SHORT_NAMES = {
    "token_budget": "budget",
    "image_batch": "images/batch",
    "max_batch_size": "batch",
    "rows_per_item": "rows/item",
    "models_per_device": "models/device",
}


def _config_text(config: dict) -> str:
    """Compact: `budget 8192 batch 256`, `rows/item 256 1x2 prefetch 2` (layout: workers x threads)."""
    parts = []
    for key, value in config.items():
        parts.append(f"{value[0]}x{value[1]}" if key == "layout" else f"{SHORT_NAMES.get(key, key)} {value}")
    return " ".join(parts)


def _figures_text(trial: Trial) -> str:
    f = trial.outcome.figures
    parts = [f"{f.get('rows_per_s', 0.0):.1f} rows/s"]
    if f.get("p99_ms") is not None:
        parts.append(f"p99 {f['p99_ms']:.0f} ms (p50 {f['p50_ms']:.0f}, n={f['requests']}, failed {f['failures']})")
    if f.get("padding") is not None:
        parts.append(f"padding {f['padding']:.1%}")
    if f.get("other_cpu") is not None:
        parts.append(f"other CPU {f['other_cpu']:.0%}")
    if not trial.outcome.feasible:
        parts.append(f"BREAKS LIMITS {trial.outcome.note}".strip())
    parts.append(f"{trial.seconds:.0f} s")
    return ", ".join(parts)


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _machine(plan) -> str:
    import torch

    cores = _cores()
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    text = f"{cores} cores ({cpu}), {psutil.virtual_memory().total / 2**30:.0f} GiB RAM, torch {torch.__version__}"
    if plan.kind == "cuda":
        text += f", {torch.cuda.get_device_name(plan.device)} ({plan.dtype})"
    return text


def _or_dash(value) -> str:
    return "-" if value is None else f"{value:.0f}"


def _percent(value) -> str:
    return "-" if value is None else f"{value:.0%}"
