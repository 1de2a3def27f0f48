"""Validated configuration: the model catalog and cluster profiles.

The YAML files beside this module are the shipped catalog and profiles. Every
part of Shoal (client, scheduler plugin, workers) reads them through these
pydantic models, so a typo is a clear error naming the file and the field
rather than a surprise deep inside a worker. Nothing here imports torch.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

CONFIG_DIR = Path(__file__).resolve().parent
DEFAULT_PROFILE = "auto"  # configs/auto.py: read off this machine

# A batch item's lease and attempts, and the grace before items no worker can host are given up:
# the profile's defaults, and the queue's for a job submitted without them (scheduler_plugins/jobs).
LEASE_SECONDS = 60.0
MAX_ATTEMPTS = 3
UNPLACEABLE_SECONDS = 30.0
# The most online requests one pull leases, whatever a model's `max_batch_size` (GPU profiles tune it to
# thousands): it bounds a pull reply's size, and what a worker that freezes holds up.
MAX_ONLINE_BATCH = 512
# An online request's deadline is the gateway's `request_timeout_seconds` for each this many inputs begun: a request
# of up to 2,048 texts (OpenAI's limit) or 10,000 documents (Cohere's) runs as several model calls.
DEADLINE_INPUTS = 256


def cache_dir() -> Path:
    """The Shoal cache (``$SHOAL_CACHE_DIR``, default ``~/.cache/shoal``): auto profiles, verdicts, ONNX exports."""
    return Path(os.environ.get("SHOAL_CACHE_DIR") or "~/.cache/shoal").expanduser()


def log_like_dask() -> None:
    """In a `dask scheduler` or `dask worker` process (Shoal's preloads), Shoal's log lines go where Dask's do, at
    Dask's level: Dask configures only its own loggers, so Shoal's showed only from WARNING, unformatted. Left
    alone where logging is configured already (the root logger has handlers, or Dask config `logging: shoal`)."""
    shoal, dask_logger = logging.getLogger("shoal"), logging.getLogger("distributed")
    if shoal.handlers or logging.getLogger().handlers:
        return
    for handler in dask_logger.handlers:
        shoal.addHandler(handler)
    if shoal.level == logging.NOTSET:
        shoal.setLevel(dask_logger.getEffectiveLevel())


class ConfigError(ValueError):
    """A catalog or profile that cannot be used, with the reason."""


RuntimeName = Literal["torch", "onnx"]
RuntimeDType = Literal["auto", "float32", "float16", "bfloat16", "int8"]
# The quality gate's evidence beside a choice, as a profile holds it: its verdict, figures (cosine and nDCG@10 for
# an embedder, Kendall's tau for a reranker), failures, texts and date; pipeline/tuning/quality_gate.py writes it.
GateEvidence = dict[str, str | int | float | list[str]]


class RuntimeChoice(BaseModel):
    """Which runtime and number format compute a model, with the quality gate's evidence.

    ``gate`` holds the figures and verdict of ``shoal check-precision`` (or
    ``shoal tune``) so a reader of the profile sees why this choice was made.
    """

    model_config = ConfigDict(extra="forbid")

    runtime: RuntimeName = "torch"
    dtype: RuntimeDType = "auto"
    # The machine features this choice was fast on (configs/machine.py NEEDS: bf16, vnni, amx, cc>=8.0, ...):
    # on a machine without them it is not used (`hold`), and `auto` chooses instead.
    needs: list[str] = Field(default_factory=list)
    gate: GateEvidence | None = None

    @field_validator("needs")
    @classmethod
    def _known_needs(cls, needs: list[str]) -> list[str]:
        from .machine import NEEDS, valid_need

        unknown = [need for need in needs if not valid_need(need)]
        if unknown:
            raise ValueError(f"unknown needs {unknown}: name some of {sorted(NEEDS)} or cc>=MAJOR.MINOR")
        return needs

    @model_validator(mode="after")
    def _supported_pair(self) -> RuntimeChoice:
        # torch int8 and ONNX Runtime half precision are slower than fp32 on CPUs: not offered.
        if self.runtime == "torch" and self.dtype == "int8":
            raise ValueError("dtype int8 runs on runtime onnx (dynamic quantization), not torch")
        if self.runtime == "onnx" and self.dtype in ("float16", "bfloat16"):
            raise ValueError(f"runtime onnx runs float32 or int8, not {self.dtype}")
        return self


DEFAULT_TOKEN_BUDGET = {"cpu": 8192, "cuda": 65536}  # padded tokens per forward pass, by device kind
DEFAULT_IMAGE_BATCH = {"cpu": 32, "cuda": 256}  # images per forward pass of an image kind, by device kind
# One image's limits, in batch jobs (workers/data/images.py) and online (the gateway's defaults): its encoded
# bytes (Cohere's per-image limit), and its pixels, Pillow's own default (about 89.5 megapixels, a quarter GiB of
# RGB), past which a few kilobytes of PNG are a decompression bomb.
MAX_IMAGE_BYTES = 5 << 20
MAX_IMAGE_PIXELS = 89_478_485


class AdapterSpec(BaseModel):
    """A LoRA adapter over a base model: a ModelSpec's `adapter` (configs/adapters.py reads its folder).

    The spec around it describes the base (kind, window, weights), so an adapter is a model of its base's kind;
    a worker loads the base once and each adapter over it (workers/model_pool.py).
    """

    model_config = ConfigDict(extra="forbid")

    base: str  # the base model's name
    name: str  # the adapter's own name: the model is BASE+NAME, and NAME is the adapter's inside PEFT
    source: str  # the adapter's folder: adapter_config.json and its weights
    memory_bytes: int = Field(default=1, gt=0)  # its weights' bytes, until a worker measures them
    # Served merged into a copy of its base (a profile's `merged_adapters`): a base's memory, no LoRA work per
    # forward, no batches shared with its base's other adapters.
    merged: bool = False


class ModelSpec(BaseModel):
    """One catalog entry: what a worker needs to load and batch a model."""

    model_config = ConfigDict(extra="forbid")

    name: str
    kind: str  # one of the registry's (configs/kinds); a folder's is told from its files (model_resolution)
    source: str = ""
    dim: int = Field(gt=0)
    max_seq_length: int = Field(gt=0)
    normalize: bool = False
    memory_bytes: int = Field(default=500_000_000, gt=0)
    token_budget: dict[str, int] = Field(default_factory=lambda: dict(DEFAULT_TOKEN_BUDGET))
    max_batch_size: int = Field(default=256, gt=0)
    # An image kind's forward batch, by device kind: images per forward, the image analogue of `token_budget`.
    image_batch: dict[str, int] = Field(default_factory=lambda: dict(DEFAULT_IMAGE_BATCH))
    requires: dict[str, float] = Field(default_factory=dict)
    runtimes: dict[str, RuntimeChoice] = Field(default_factory=dict)  # by device kind; absent: torch
    # Named prompts laid over the model's own (config_sentence_transformers.json); see configs/prompts.py.
    prompts: dict[str, str] | None = None
    default_prompt_name: str | None = None
    # A source in object storage (an fsspec URL): fsspec's keyword arguments to read it (configs/model_store.py).
    storage_options: dict[str, Any] = Field(default_factory=dict)
    # Every model: the load time placement expects before a worker has measured one (0: its default guess,
    # scheduler_plugins/placement.py); the simulated runtime also sleeps it as its load.
    load_seconds: float = 0.0
    # Simulated runtime only: timings of a device that is not there.
    batch_fixed_seconds: float = 0.0
    per_token_seconds: float = 0.0
    # A LoRA adapter over the model the fields above describe; the spec is then named BASE+ADAPTER.
    adapter: AdapterSpec | None = None

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, kind: str) -> str:
        from .kinds import names

        if kind not in names():
            raise ValueError(f"unknown kind {kind!r}: one of {', '.join(names())}")
        return kind

    @field_validator("token_budget", "image_batch")
    @classmethod
    def _budgets_positive(cls, budgets: dict[str, int], info: ValidationInfo) -> dict[str, int]:
        for device, budget in budgets.items():
            if budget <= 0:
                raise ValueError(f"{info.field_name}.{device} must be positive, got {budget}")
        return budgets

    @property
    def online_batch(self) -> int:
        """Online requests one pull leases at most, and their inputs in all (a request has a text or more): a
        forward batch's worth. A worker that has measured its rounds asks for fewer (Profile.online_round_seconds)."""
        return min(self.max_batch_size, MAX_ONLINE_BATCH)

    def budget_for(self, device_kind: str) -> int:
        """Padded tokens per forward pass on this kind of device."""
        return self.token_budget.get(device_kind) or self.token_budget.get("cpu") or 8192

    def images_for(self, device_kind: str) -> int:
        """Images per forward pass on this kind of device (an image kind's)."""
        return self.image_batch.get(device_kind) or self.image_batch.get("cpu") or DEFAULT_IMAGE_BATCH["cpu"]

    def resolve_path(self) -> str:
        """The local directory holding the weights; never a hub download."""
        if self.source.startswith("package:"):
            module_name = self.source.removeprefix("package:")
            try:
                module = importlib.import_module(module_name)
            except ImportError as exc:
                raise ConfigError(f"model {self.name!r}: package {module_name!r} is not installed ({exc})") from exc
            return str(module.get_model_path())
        if self.source.startswith("hf:"):
            from .hub import hub_source_path

            return hub_source_path(self.source)
        from .model_store import is_store_url

        if is_store_url(self.source):
            from .model_store import local_copy, unpinned

            url, key = unpinned(self.source)
            return str(local_copy(url, self.storage_options, key).folder)
        path = Path(self.source).expanduser()
        if not path.is_dir():
            raise ConfigError(f"model {self.name!r}: source directory {self.source!r} does not exist")
        return str(path)


class Catalog(BaseModel):
    models: dict[str, ModelSpec]
    # How a model named by a store URL is read (a command's --storage-options), as its input is.
    _storage_options: dict[str, Any] = PrivateAttr(default_factory=dict)

    def get(self, name: str) -> ModelSpec:
        """The catalog entry, its source pinned to what it holds now; else the model's own files: a local folder,
        a folder in object storage, or a Hugging Face id (cached, else downloaded)."""
        from .adapters import resolve_adapter
        from .model_resolution import pin_source, resolve_unlisted

        if name in self.models:
            return pin_source(self.models[name])
        adapter = resolve_adapter(self, name)
        if adapter is not None:
            return adapter

        return resolve_unlisted(name, sorted(self.models), self._storage_options)

    def reading_with(self, storage_options: dict[str, Any]) -> Catalog:
        """This catalog, a model named by a store URL read with `storage_options` (a command's own)."""
        self._storage_options = dict(storage_options)
        return self


class GatewaySettings(BaseModel):
    """The online endpoint: where it listens and the limits that protect it.

    A profile's `gateway:` section; `shoal serve` options and the scheduler's
    `--shoal-gateway-*` options override `host` and `port`.
    """

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"  # loopback unless configured otherwise
    port: int = Field(default=8790, ge=0, le=65535)
    token_env: str = "SHOAL_GATEWAY_TOKEN"  # bearer token from this variable, if set
    token_file: str | None = None  # or from this file; neither: no auth
    max_body_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    # Texts per encode request (OpenAI's limit) and documents per rerank request (Cohere's); the gateway splits
    # a request of more than a model's online batch into parts (scheduler_plugins/gateway/request_parts.py).
    max_inputs: int = Field(default=2048, gt=0)
    max_documents: int = Field(default=10_000, gt=0)
    max_input_chars: int = Field(default=16_384, gt=0)  # longer: cut, or 422 without truncation
    # An image input's encoded bytes and decoded pixels (checked from its header, before any decoding): else a 400.
    max_image_bytes: int = Field(default=MAX_IMAGE_BYTES, gt=0)
    max_image_pixels: int = Field(default=MAX_IMAGE_PIXELS, gt=0)
    # OpenAI token arrays: ids in one (OpenAI's limit per input) and in all of a request's (OpenAI's per request).
    max_input_tokens: int = Field(default=8192, gt=0)
    max_request_tokens: int = Field(default=300_000, gt=0)
    max_queue_depth: int = Field(default=4096, gt=0)  # requests of a model not yet answered, then 429
    # The inputs one request may hold queued or computing at once (its other parts wait in the gateway). The
    # queue takes online work in fair shares across requests (scheduler_plugins/model_queues.py) whatever this
    # is; it bounds what one large request holds in the queue, and of `max_queue_depth`.
    max_inputs_in_flight: int = Field(default=2048, gt=0)
    # A request of more inputs is queued as parts of at most this many (and of the model's online batch), each
    # an online item: a worker's round takes as many parts as it computes within its `online_round_seconds`.
    # A request that comes waits behind at most about one part of each large request (the fair queue), so
    # small parts keep its wait short beside several large requests; a part costs the queue one item.
    max_part_inputs: int = Field(default=8, gt=0)
    request_timeout_seconds: float = Field(default=30.0, gt=0)  # then 504; for each DEADLINE_INPUTS inputs begun
    retry_after_seconds: int = Field(default=1, ge=0)
    # Leases of one request, as for batch items: a request survives two lost, frozen or starved workers.
    max_attempts: int = Field(default=MAX_ATTEMPTS, gt=0)
    # A request's lease on a worker, renewed while the worker holds it: a worker that stops answering
    # (frozen, paused) loses its requests to another within about this long.
    online_lease_seconds: float = Field(default=0.5, gt=0)
    # A connection's request head must arrive within this long of its opening or of its last answer
    # (so an idle keep-alive connection closes then too); a slow-header client holds no socket for ever.
    header_timeout_seconds: float = Field(default=60.0, gt=0)
    body_timeout_seconds: float = Field(default=30.0, gt=0)  # a body not read within this long of its head: 408
    max_connections: int = Field(default=1024, gt=0)  # open connections; one more is answered 503 and closed
    # A quota per client (its bearer token; its address with auth off): requests a second on average, and at once.
    # Over it: 429 with Retry-After. None: no limit.
    requests_per_second: float | None = Field(default=None, gt=0)
    request_burst: int | None = Field(default=None, gt=0)  # default: a second's worth, at least 1

    def deadline(self, inputs: int) -> float:
        """A request's deadline: `request_timeout_seconds` for each DEADLINE_INPUTS of its inputs begun."""
        return self.request_timeout_seconds * max(1, math.ceil(inputs / DEADLINE_INPUTS))

    @property
    def longest_deadline(self) -> float:
        """The deadline of the largest request the limits allow."""
        return self.deadline(max(self.max_inputs, self.max_documents))


class Profile(BaseModel):
    """A cluster profile: worker layout and queue knobs, tuned per hardware."""

    model_config = ConfigDict(extra="forbid")

    name: str
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    workers: int = Field(default=1, gt=0)
    # The embedded cluster's one worker inside the command's own process, reached over
    # Dask's inproc comms: an online request skips two TCP hops (see pipeline/cluster.py).
    in_process_workers: bool = False
    threads_per_worker: int = Field(default=0, ge=0)
    prefetch: int = Field(default=2, gt=0)
    rows_per_item: int = Field(default=1024, gt=0)
    lease_seconds: float = Field(default=LEASE_SECONDS, gt=0)
    max_attempts: int = Field(default=MAX_ATTEMPTS, gt=0)
    unplaceable_seconds: float = Field(default=UNPLACEABLE_SECONDS, ge=0)
    pull_timeout_seconds: float = Field(default=2.0, gt=0)
    # How long one online round of a model may compute on a worker: its pulls lease the inputs it computes in
    # this long, by a fit of its last rounds' times (workers/batching/round_sizes.py). A round is not preempted,
    # so a request that comes while one computes waits for it: this bounds that wait. On a slow device it costs
    # large requests some throughput (2 CPU cores, MiniLM: a 2,048-text request alone 0.72x; docs/BENCHMARKS.md).
    online_round_seconds: float = Field(default=0.25, gt=0)
    memory_fraction: float = Field(default=0.5, gt=0, le=1)
    pinned: list[str] = Field(default_factory=list)
    token_budgets: dict[str, int] = Field(default_factory=dict)
    max_batch_sizes: dict[str, PositiveInt] = Field(default_factory=dict)  # per model, like token_budgets
    image_batches: dict[str, PositiveInt] = Field(default_factory=dict)  # per image model: its image_batch
    runtimes: dict[str, RuntimeChoice] = Field(default_factory=dict)  # per model, on this profile's device kind
    # LoRA adapters (BASE+ADAPTER) served merged into a copy of their base each, instead of over the shared base:
    # for an adapter with traffic enough for batches of its own (docs/BENCHMARKS.md, LoRA adapters).
    merged_adapters: list[str] = Field(default_factory=list)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    # Why the layout and each model's runtime are what they are: `auto` fills it (configs/auto.py),
    # the job summary and `shoal serve`'s start line print it.
    reasons: dict[str, str] = Field(default_factory=dict)
    # Models whose pinned runtime this machine cannot make fast (`hold`), and why: `auto` chooses theirs.
    _held: dict[str, str] = PrivateAttr(default_factory=dict)
    _path: str = PrivateAttr(default="")
    _machine: Any = PrivateAttr(default=None)  # shoal.configs.machine.Machine, for `auto`

    @model_validator(mode="after")
    def _one_worker_in_process(self) -> Profile:
        # Several workers in one process would share one interpreter lock and run one
        # OpenMP team each on the same cores.
        if self.in_process_workers and self.workers != 1:
            raise ValueError(f"in_process_workers runs one worker; this profile asks for workers: {self.workers}")
        return self

    @property
    def path(self) -> str:
        """The YAML file this profile came from, for worker processes to load."""
        return self._path

    def tuned(self, spec: ModelSpec) -> ModelSpec:
        """The spec with this profile's tuned token budget and images per batch (every device kind), batch cap.

        A LoRA adapter computes in its base's batches, so it is tuned as its base is (merged: as itself).
        """
        update: dict = {}
        merged = self.merges(spec)
        name = self.entry_of(spec)
        budget = self.token_budgets.get(name)
        if budget is not None:
            update["token_budget"] = {kind: budget for kind in ("cpu", "cuda")}
        images = self.image_batches.get(name)
        if images is not None:
            update["image_batch"] = {kind: images for kind in ("cpu", "cuda")}
        if name in self.max_batch_sizes:
            update["max_batch_size"] = self.max_batch_sizes[name]
        if name in self.runtimes:
            kinds = ("cpu", "cuda") if self.device == "auto" else (self.device,)
            update["runtimes"] = {**spec.runtimes, **{kind: self.runtimes[name] for kind in kinds}}
        if merged and spec.adapter is not None and not spec.adapter.merged:
            update["adapter"] = spec.adapter.model_copy(update={"merged": True})
        return spec.model_copy(update=update) if update else spec

    def merges(self, spec: ModelSpec) -> bool:
        """Whether `spec` is a LoRA adapter served merged into a copy of its base (a model of its own)."""
        return spec.adapter is not None and (spec.adapter.merged or spec.name in self.merged_adapters)

    def entry_of(self, spec: ModelSpec) -> str:
        """The name whose entries (runtimes, token_budgets, ...) tune `spec`: an adapter computes in its base's
        forward passes, so the base's, unless it is merged."""
        return spec.adapter.base if spec.adapter is not None and not self.merges(spec) else spec.name

    def torch_threads(self, cores: int) -> int:
        """Threads per worker process: the cores it owns, never oversubscribed."""
        if self.threads_per_worker:
            return self.threads_per_worker
        return max(1, cores // self.workers)


def read_yaml(path: Path) -> dict:
    """A YAML mapping, or a ConfigError naming the file."""
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data


def explain(path: Path, exc: ValidationError, root: str = "") -> ConfigError:
    """A pydantic error as one line naming the file and each field (`root` for the whole)."""
    problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or root}: {err['msg']}" for err in exc.errors())
    return ConfigError(f"{path}: {problems}")


def load_catalog(extra: str | os.PathLike | None = None) -> Catalog:
    """The shipped catalog, overlaid with a user's catalog file if given.

    SHOAL_CATALOG names a user catalog too, so workers started by Dask see the
    same models as the client without extra flags.
    """
    paths = [CONFIG_DIR / "catalog.yaml"]
    for user_path in (os.environ.get("SHOAL_CATALOG"), extra):
        if user_path:
            paths.append(Path(user_path))
    from .adapters import catalog_adapter, is_adapter_folder

    models: dict[str, ModelSpec] = {}
    adapters: list[tuple[Path, str, dict]] = []  # made once every base is known: a later file may hold it
    for path in paths:
        entries = read_yaml(path).get("models") or {}
        for name, entry in entries.items():
            entry = dict(entry or {})
            source = str(entry.get("source", ""))
            relative = not source.startswith(("package:", "hf:")) and "://" not in source
            if source and relative and not Path(source).expanduser().is_absolute():
                entry["source"] = str((path.parent / source).resolve())  # relative to the catalog file
            if source and is_adapter_folder(entry["source"]):
                adapters.append((path, name, entry))
                continue
            if source and not {"kind", "dim", "max_seq_length"} <= entry.keys():  # the rest from the model's files
                from .model_resolution import fields_from_source

                try:
                    entry = {**fields_from_source(name, entry["source"], entry.get("storage_options")), **entry}
                except ConfigError as exc:
                    raise ConfigError(f"{path}: models.{name}: {exc}") from None
            try:
                models[name] = ModelSpec(**{"name": name, **entry})
            except ValidationError as exc:
                raise explain(path, exc) from None
            except TypeError as exc:
                raise ConfigError(f"{path}: models.{name}: {exc}") from None
    catalog = Catalog(models=models)
    for path, name, entry in adapters:
        spec = catalog_adapter(catalog, name, entry, str(path))
        catalog.models[spec.name] = spec
    return catalog


def load_profile(name_or_path: str | None = None) -> Profile:
    """A profile by name (configs/NAME.yaml) or by path to a YAML file."""
    name_or_path = name_or_path or os.environ.get("SHOAL_PROFILE") or DEFAULT_PROFILE
    if name_or_path == "auto":
        from .auto import auto_profile

        return auto_profile()
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = CONFIG_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            shipped = sorted(["auto", *(p.stem for p in CONFIG_DIR.glob("*.yaml") if p.stem != "catalog")])
            raise ConfigError(f"unknown profile {name_or_path!r}; shipped profiles: {', '.join(shipped)}")
    data = read_yaml(path)
    data.setdefault("name", path.stem)
    try:
        profile = Profile(**data)
    except ValidationError as exc:
        raise explain(path, exc) from None
    profile._path = str(path.resolve())
    return hold(profile)


def hold(profile: Profile, machine: Any = None) -> Profile:
    """`profile` without the choices this machine lacks the features for (their reason recorded).

    A tuned profile's bf16 pin is 1.7x fp32 where AVX-512 BF16 computes it and a fifth of fp32 where it is
    emulated; such a choice is dropped, and the model's runtime is `auto`'s (pipeline/tuning/auto_runtime).
    A pinned bf16 or fp16 worker dtype likewise falls back to `auto` (fp32 on a CPU). `machine`: the
    probed one unless given (tests force one). Worker processes load their profile through this too, so
    each holds it on its own machine.
    """
    from .machine import implied_needs, probe

    device = profile.device if profile.device != "auto" else "cpu"
    wanted = {name: [*choice.needs, *implied_needs(choice.dtype, device)] for name, choice in profile.runtimes.items()}
    dtype_needs = implied_needs(profile.dtype, device)
    if not dtype_needs and not any(wanted.values()):
        return profile
    machine = machine or probe()
    if device == "cuda" and not machine.gpus:
        return profile  # a GPU profile read off the GPUs (a client joining a GPU cluster): its workers hold it
    for name, needs in wanted.items():
        lacking = machine.lacks(needs)
        if lacking:
            choice = profile.runtimes.pop(name)
            why = (
                f"profile {profile.name} pins {choice.runtime} {choice.dtype}, which needs {', '.join(lacking)}; "
                f"this machine has not: not used"
            )
            profile._held[name] = profile.reasons[name] = why
    lacking = machine.lacks(dtype_needs)
    if lacking:
        profile.reasons["dtype"] = (
            f"profile {profile.name} pins dtype {profile.dtype}, which needs {', '.join(lacking)}; "
            "this machine has not: the workers' dtype is auto's"
        )
        profile.dtype = "auto"
    return profile
