"""The tuner's two kinds of trial, each an objective for the coordinate search.

`EmbedderTrials` times one model's token budget and batch cap on the
worker's own runtime (shoal.workers.runtimes.load_runtime) in this process, on
the fixed sample: those knobs only change the model's compute, so a trial
needs seconds and no cluster.

`ClusterTrials` times worker layout, prefetch depth, item size and models per
device the only honest way: embed jobs over the sample (the pipeline's own
prepare/run path, as `shoal embed` takes) on an embedded cluster of that
layout, with an open-loop online load on the gateway meanwhile for its p99.
A cluster is kept while only client-side knobs (item size) change, since
starting one costs seconds of worker start and model load.
"""

from __future__ import annotations

import io
import math
import shutil
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml
from distributed import Client, LocalCluster
from rich.console import Console

from ...configs import Catalog, GatewaySettings, ModelSpec, Profile, load_profile
from ...configs.kinds import for_operation
from ..cluster import pull_queue, start_local_cluster
from ..jobs.embed import EmbedRequest, embed_job
from ..jobs.engine import model_for, prepare_job, run_prepared
from .meter import MachineMeter
from .probe import OnlineProbe
from .profile import ProfileFields
from .sample import Sample
from .search import Config, Figures, Outcome

WARMUP_TEXTS = 64
WARMUP_IMAGES = 8
WORKER_START_TIMEOUT = 300


class PairedTrials:
    """A configuration timed in pairs against a reference configuration (the search's start).

    A shared machine drifts by tens of percent within minutes, so a trial
    times its configuration and the reference in alternating order,
    `repeats` times each, and scores the ratio of the best runs: a
    drift-proof "times faster than the start, here and now". Subclasses
    time one configuration (`_time`) over their `rows`.
    """

    rows: int
    reference: Config
    repeats: int

    def __call__(self, config: Config) -> Outcome:
        runs: dict[bool, list[MachineMeter]] = {True: [], False: []}  # is it the reference?
        try:
            for r in range(self.repeats):
                order = [config, self.reference] if r % 2 == 0 else [self.reference, config]
                for which in [config] if config == self.reference else order:
                    runs[which is self.reference].append(self._time(which))
        except RuntimeError as exc:  # torch.cuda.OutOfMemoryError is one
            if "out of memory" not in str(exc):
                raise
            _empty_cuda_cache()
            return Outcome(0.0, math.inf, note="out of device memory")
        best = min(runs[False] or runs[True], key=lambda m: m.seconds)
        reference = min(runs[True] or runs[False], key=lambda m: m.seconds)
        return Outcome(
            reference.seconds / best.seconds,
            figures={
                "rows_per_s": round(self.rows / best.seconds, 1),
                "vs_start": round(reference.seconds / best.seconds, 3),
                "padding": round(self._padding(config), 3),
                "other_cpu": _share(best.other_share),
            },
        )

    def _time(self, config: Config) -> MachineMeter:
        raise NotImplementedError

    def _padding(self, config: Config) -> float:
        return 0.0


class EmbedderTrials(PairedTrials):
    """Token budget x batch cap of one model (`PairedTrials`)."""

    def __init__(
        self, spec: ModelSpec, plan, texts: list[str], rows_per_item: int, reference: Config, repeats: int = 2
    ) -> None:
        from ...workers.runtimes import Scorer, load_runtime

        self.spec = spec
        embedder = load_runtime(spec, plan)  # the runtime and dtype phase 0 chose
        if isinstance(embedder, Scorer):
            raise ValueError(f"model {spec.name!r} scores pairs: the embed trials cannot measure it")
        self.embedder = embedder
        self.items = [texts[i : i + rows_per_item] for i in range(0, len(texts), rows_per_item)]
        self.lengths = [self.embedder.token_lengths(item)[0] for item in self.items]
        self.rows = len(texts)
        self.reference = dict(reference)
        self.repeats = repeats
        self.embedder.embed(texts[:WARMUP_TEXTS])
        self.memory_bytes = self.embedder.memory_bytes()

    def _time(self, config: Config) -> MachineMeter:
        # Both knobs are read on every embed() call, so one loaded model serves every trial.
        self.embedder.token_budget = int(config["token_budget"])
        self.embedder.spec = self.spec.model_copy(update={"max_batch_size": int(config["max_batch_size"])})
        with MachineMeter() as meter:
            for item in self.items:
                self.embedder.embed(item)
        return meter

    def _padding(self, config: Config) -> float:
        from ...workers.batching.token_batching import plan_batches

        budget, max_batch = int(config["token_budget"]), int(config["max_batch_size"])
        computed = sum(
            len(batch) * int(lengths[batch].max())
            for lengths in self.lengths
            for batch in plan_batches(lengths, budget, max_batch)
        )
        return 1 - sum(int(lengths.sum()) for lengths in self.lengths) / max(computed, 1)

    def close(self) -> None:
        self.embedder.close()


class ImageTrials(PairedTrials):
    """Images per forward batch of an image model (its `image_batch`), timed in pairs as `EmbedderTrials`
    times token budgets: each trial embeds the same drawn JPEGs, decoded and prepared as a job's are."""

    def __init__(self, spec: ModelSpec, plan, images: int, rows_per_item: int, reference: Config, repeats: int = 2):
        from ...workers.runtimes import load_runtime
        from ...workers.runtimes.image_embedder import drawn_images

        self.spec = spec
        self.embedder = cast(Any, load_runtime(spec, plan))  # an ImageEmbedder
        drawn = drawn_images(images)
        self.items = [drawn[i : i + rows_per_item] for i in range(0, len(drawn), rows_per_item)]
        self.rows = len(drawn)
        self.reference = dict(reference)
        self.repeats = repeats
        self.embedder.embed_images(drawn[:WARMUP_IMAGES])
        self.memory_bytes = self.embedder.memory_bytes()

    def _time(self, config: Config) -> MachineMeter:
        self.embedder.image_batch = int(config["image_batch"])  # read on every embed_images() call
        with MachineMeter() as meter:
            for item in self.items:
                self.embedder.embed_images(item)
        return meter

    def close(self) -> None:
        self.embedder.close()


@dataclass(eq=False)
class ClusterTrials:
    """Worker layout, prefetch, item size, models per device: jobs on an embedded cluster.

    `fractions`: by k, the memory_fraction that lets each worker hold k of the
    models; without a p99 target the online latency is only measured.
    """

    base: Profile
    catalog: Catalog
    catalog_path: str | None
    models: list[str]
    sample: Sample
    scratch: Path
    fractions: dict[int, float]
    online_rate: float = 0.0
    p99_target_ms: float | None = None
    trials: int = field(default=0, init=False)
    _cluster: tuple[tuple, LocalCluster, Client, str | None] | None = field(default=None, init=False)

    def profile_fields(self, config: Config) -> ProfileFields:
        """The profile fields a configuration stands for."""
        workers, threads = config["layout"]
        fields: ProfileFields = {"workers": workers, "threads_per_worker": threads, "prefetch": config["prefetch"]}
        if "rows_per_item" in config:
            fields["rows_per_item"] = config["rows_per_item"]
        if "models_per_device" in config:
            fields["memory_fraction"] = self.fractions[int(config["models_per_device"])]
        return fields

    def __call__(self, config: Config) -> Outcome:
        self.trials += 1
        fields = self.profile_fields(config)
        profile = self._write_profile(fields)
        pinned = self.models if len(self.models) <= int(config.get("models_per_device", len(self.models))) else []
        try:
            started, client, url = self._cluster_for(profile, pinned)
            with MachineMeter() as meter:
                rows, seconds, failed, online = self._run_jobs(client, profile, url)
        except Exception as exc:  # a layout that cannot run is a result, not a crash
            self.close()
            return Outcome(0.0, math.inf, note=f"{type(exc).__name__}: {exc}"[:200])
        figures: Figures = {
            "rows_per_s": round(rows / seconds, 1),
            "cluster_start_s": started,
            "other_cpu": _share(meter.other_share),
            **online,
        }
        violation = 0.0
        if failed:
            return Outcome(rows / seconds, math.inf, figures, note=f"{failed} failed parts")
        if self.online_rate and self.p99_target_ms:
            p99 = online.get("p99_ms")
            violation = math.inf if p99 is None else max(0.0, p99 / self.p99_target_ms - 1)
            violation += (online.get("failures") or 0) / max(online.get("requests") or 0, 1)
        return Outcome(rows / seconds, violation, figures)

    def close(self) -> None:
        if self._cluster is not None:
            _, cluster, client, url = self._cluster
            self._cluster = None
            if url:
                try:
                    client.sync(pull_queue(client).gateway_stop)
                except Exception:
                    pass
            client.close()
            cluster.close()

    # -- internals --------------------------------------------------------------

    def _write_profile(self, fields: ProfileFields) -> Profile:
        data = {**self.base.model_dump(), **fields, "name": "tune-trial"}
        path = self.scratch / f"trial-{self.trials:03d}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return load_profile(str(path))

    def _cluster_for(self, profile: Profile, pinned: list[str]) -> tuple[float | None, Client, str | None]:
        """A cluster of this profile's worker side; (start seconds or None if reused, client, gateway URL)."""
        key = (profile.workers, profile.threads_per_worker, profile.prefetch, profile.memory_fraction, tuple(pinned))
        if self._cluster is not None and self._cluster[0] == key:
            return None, self._cluster[2], self._cluster[3]
        self.close()
        argv = [arg for name in pinned for arg in ("--shoal-pin", name)]
        with MachineMeter() as meter:
            cluster = start_local_cluster(profile, self.catalog_path, online=bool(self.online_rate), preload_argv=argv)
            client = Client(cluster)
            client.wait_for_workers(profile.workers, timeout=WORKER_START_TIMEOUT)
            url = None
            if self.online_rate:
                specs = {
                    m: model_for(self.catalog, profile, m, for_operation("embed")).model_dump() for m in self.models
                }
                settings = GatewaySettings(host="127.0.0.1", port=0).model_dump()
                url = client.sync(pull_queue(client).gateway_start, settings, specs)["url"]
        self._cluster = (key, cluster, client, url)
        return round(meter.seconds, 1), client, url

    def _run_jobs(self, client: Client, profile: Profile, url: str | None) -> tuple[int, float, int, Figures]:
        """Every model's job at once; (rows, seconds on the scheduler's clock, failed parts, online figures)."""
        out = self.scratch / f"out-{self.trials:03d}"
        prepared = [
            prepare_job(
                embed_job(EmbedRequest(self.sample.url, str(out / name), name)),
                model_for(self.catalog, profile, name, for_operation("embed")),
                profile,
            )
            for name in self.models
        ]
        quiet = Console(file=io.StringIO())
        probe = OnlineProbe(url, self.models[0], self.sample.texts, self.online_rate) if url else nullcontext()
        try:
            with probe, ThreadPoolExecutor(len(prepared)) as pool:
                outcomes = list(pool.map(lambda job: run_prepared(client, job, profile, quiet), prepared))
        finally:
            shutil.rmtree(out, ignore_errors=True)
        rows = sum(o.status["rows_done"] for o in outcomes)
        seconds = max(o.status["elapsed"] for o in outcomes)
        failed = sum(o.status["failed"] for o in outcomes)
        online = probe.figures() if isinstance(probe, OnlineProbe) else {}
        return rows, seconds, failed, online


def _share(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _empty_cuda_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
