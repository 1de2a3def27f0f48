"""The pull queue's messages, and its client: the one module every side imports.

The scheduler extension (`pull_queue.PullQueue`) declares the handlers; `PullQueueClient` has one method per
handler, so a handler's name and arguments are spelled here and at the
handler, nowhere else. The CLI, the workers' pull loop, `shoal status`,
a gateway in its own process and the benchmarks all call through it.

Messages travel as Dask messages (MessagePack), so they are plain dicts on
the wire; the TypedDicts below give them names and types in the code.

What an item costs in messages decides how many workers one scheduler feeds,
so the unit of a message is many items. A worker asks for work by RPC (the
long-poll `pull`, one per many items); everything else it says travels one
way on Dask's worker stream (``EVENTS``: starts, acks, failures and lease
renewals, coalesced into one message per flush), and what the scheduler
must tell a worker unasked (``REVOKE``: an item it no longer holds) travels
one way on the scheduler's stream to that worker. An online worker's group
acks ride on its next online pull.

Words used everywhere: a worker *holds* a model it has loaded, is loading,
or has work in hand for; it has a model *loaded* when its weights are in
memory, ready to compute.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal, NotRequired, Required, TypedDict, get_args

from ..configs.kinds.token_classifier import Aggregation

NAME = "shoal-pull-queue"  # the scheduler plugin's name and its key in `scheduler.extensions`
EVENTS = "shoal-events"  # worker -> scheduler stream op: WorkerEvents
REVOKE = "shoal-revoke"  # scheduler -> worker stream op: {"items": [item id, ...]}


class Lane(StrEnum):
    """Which of its model's queues an item waits in: online requests are leased before batch items."""

    ONLINE = "online"
    BATCH = "batch"


# How vectors are stored or sent: batch jobs' outputs and online answers alike.
Precision = Literal["float32", "float16", "int8", "uint8", "binary", "ubinary"]
PRECISIONS: tuple[Precision, ...] = get_args(Precision)


# Keyword arguments for fsspec (credentials, endpoint, ...): whatever the store's filesystem takes.
StorageOptions = dict[str, Any]

# A model spec as it travels: ``configs.ModelSpec.model_dump()``, read back into a ModelSpec once, where it
# enters a process (model_specs.ModelSpecs). Plain data on the wire, so this module stays free of pydantic models.
SpecFields = dict[str, Any]
GatewayFields = dict[str, Any]  # configs.GatewaySettings.model_dump(), likewise


# -- what a batch item carries: its payload ----------------------------------------------
#
# A job's options (planned once, pipeline/jobs) are copied into each item's payload beside
# where its rows are; the job's context (sent once per pull) is laid under it on the worker.
# Every key is optional to the type: the planner adds the slice, the worker merges the context.


class ChunkFields(TypedDict, total=False):
    """shoal.workers.data.chunking.ChunkSettings as it travels."""

    tokens: Required[int]
    overlap: int


class VectorFields(TypedDict, total=False):
    """shoal.workers.data.vector_precision.VectorFormat as it travels: how vectors are stored."""

    precision: Precision
    dim: int
    ranges: list[list[float]]  # int8/uint8: per-dimension [mins, maxes]


class JobContext(TypedDict, total=False):
    """What every item of a job shares, sent once per pull and never echoed in job status."""

    storage_options: StorageOptions


class SlicePayload(JobContext, total=False):
    """Where a batch item's rows are and where its part goes (pipeline/jobs/planner)."""

    input: str  # the shard's URL
    output: str  # the part's URL
    part: str  # the part's name
    row_groups: list[int] | None  # [first, end) row groups of a Parquet shard; None: all (or a text shard)
    rows: list[int] | None  # [start, end) within those row groups (or a text range's lines); None: all
    row_range: list[int]  # [start, end) rows within the whole shard
    format: str  # a text shard's format: jsonl or csv
    byte_range: list[int]  # a text shard's [first, end) bytes (of the decompressed stream, when gzipped)
    first_line: int  # a text shard's line of the item's first row, for rejections
    header: str  # a CSV shard's header line
    input_format: str  # parquet, jsonl or csv, when the job names it
    part_metadata: dict[str, str]  # the part's stamp (pipeline/jobs/resume)
    id_column: str | None
    keep_columns: list[str]
    # How the part is stored; the engine handles them for any operation, embed jobs set them.
    vectors: VectorFields
    lance: str  # a Lance dataset the rows go to; the part is its marker


class EmbedPayload(SlicePayload, total=False):
    """An `embed` item (workers/embed_operation)."""

    text_column: str
    chunk: ChunkFields
    prompt: str  # the prompt text before every text; absent: the model's default


class KindPayload(EmbedPayload, total=False):
    """An item of the other kinds: `sparse`, `multivector`, `classify` (workers/operations/<op>_operation)."""

    top_k: int  # sparse: the largest terms kept; classify: the best labels kept; absent: the model's default
    input_type: Literal["query", "document"]  # multivector: ColBERT's query or document encoding (document)


class ImagePayload(KindPayload, total=False):
    """An image kind's `embed` item of images (workers/operations/image_operation): files, or a column."""

    image_column: str  # a column of image bytes, or of URIs (any fsspec URL, or data: URIs)
    root: str  # image files: the folder their paths are under (the rows' ids)
    files: list[str]  # image files: the item's, under `root`
    max_image_bytes: int  # an image larger is that row's rejection; absent: workers/data/images.py's default
    max_image_pixels: int  # an image with more pixels (a decompression bomb) likewise


class RerankPayload(SlicePayload, total=False):
    """A `rerank` item (workers/rerank_operation)."""

    mode: Literal["pairs", "candidates"]
    query_column: str
    passage_column: str | None
    candidates_column: str | None
    candidate_ids_column: str | None
    max_candidates: int


class SimPayload(TypedDict, total=False):
    """A `sim` item: token counts instead of rows (workers/sim_operation)."""

    tokens: list[int]
    texts: int
    min_tokens: int
    max_tokens: int
    seed: int


class EncodePayload(TypedDict, total=False):
    """An online `encode` request (scheduler_plugins/gateway/api_formats.EncodeCall): texts, or an image model's
    images (encoded bytes, checked by the gateway up to their headers)."""

    texts: list[str]
    images: list[bytes]
    max_image_bytes: int  # the gateway's limits, which the worker's decoding keeps to
    max_image_pixels: int
    first_input: int  # a part of a larger request (gateway/request_parts.py): its first input's index there
    truncate: bool
    dtype: str
    precision: Precision
    dim: int
    ranges: list[list[float]]
    prompt_name: str
    prompt: str
    # The LoRA adapter the request's inputs go through: set by the worker from the request's model, so that
    # requests for several adapters of one base share a call (workers/batching/online_groups); never a client's.
    adapter: str


class ScorePayload(TypedDict, total=False):
    """An online `score` request (scheduler_plugins/gateway/api_formats.ScoreCall)."""

    query: Required[str]
    documents: Required[list[str]]
    truncate: bool
    adapter: str  # as EncodePayload's


class TextsPayload(TypedDict, total=False):
    """An online request of the other kinds: `sparse`, `multivector`, `classify` (scheduler_plugins/gateway/kind_routes.py)."""

    texts: Required[list[str]]
    truncate: bool
    adapter: str  # as EncodePayload's
    top_k: int  # as KindPayload's
    input_type: Literal["query", "document"]
    # multivector: the vectors' format, as EncodePayload's
    dtype: str
    precision: Precision
    dim: int
    ranges: list[list[float]]


class ClassifyOptions(TypedDict, total=False):
    """What a `classify` or `extract` job or request asks besides top_k (workers/operations/classify_operation,
    extract_operation)."""

    threshold: float  # labels (entities) scoring below it are dropped
    labels: list[str]  # classify: zero-shot labels (an NLI model); extract: the entity labels kept (found, by GLiNER)
    template: str  # classify, zero-shot: the hypothesis, "{}" standing for the label
    multi_label: bool  # classify, zero-shot: each label scored on its own; extract, GLiNER: a span may carry several
    aggregation: Aggregation  # extract


class ClassifyPayload(KindPayload, ClassifyOptions, total=False):
    """A `classify` or `extract` item."""


class ClassifyTexts(TextsPayload, ClassifyOptions, total=False):
    """An online `classify` or `extract` request."""


BatchPayload = EmbedPayload | RerankPayload | SimPayload | KindPayload
OnlinePayload = EncodePayload | ScorePayload | TextsPayload
Payload = BatchPayload | OnlinePayload


class ServedModel(TypedDict):
    """One entry of a gateway's ``GET /v1/models``."""

    id: str
    object: str  # "model"
    owned_by: str
    kind: str
    dim: int
    max_seq_length: int
    loaded_workers: int
    parent: NotRequired[str]  # a LoRA adapter's base model (as vLLM lists its adapters)


# -- what a worker answers -----------------------------------------------------------------


class PartRecord(TypedDict):
    """A part written: what the manifest lists and a re-run trusts (pipeline/jobs/resume)."""

    part: str
    input: str
    row_range: list[int]
    rows: int
    bytes: int


class ItemResult(TypedDict, total=False):
    """A batch item's ack: its part (a `PartRecord`) and its counts; a `sim` item's: rows, tokens, truncated."""

    rows: Required[int]
    part: str
    input: str
    row_range: list[int] | None
    bytes: int
    rejected: int  # rows without a result, all of them
    rejections: list[str]  # the first of them, each naming its file, row and column
    truncated: int
    null_texts: int
    null_images: int  # an image kind's rows with a null image (a null embedding), not counted as rejected
    empty_texts: int
    chunks: int
    pairs: int
    tokens: int
    compute_seconds: float


class DeadLetter(TypedDict, total=False):
    """An item given up on: out of attempts, failed for good, or not written (pipeline/jobs/engine)."""

    id: str
    model: str
    payload: Required[SlicePayload]
    attempts: int
    errors: Required[list[str]]
    rows: int


class OnlineResult(TypedDict, total=False):
    """An online request's answer from a worker (an operation's `online`, workers/operations), or its error and HTTP status."""

    embeddings: bytes  # encode: raw little-endian values, `shape` and `dtype` say how to read them
    shape: list[int]
    dtype: str
    scores: list[float]  # score: one per document, in document order
    outputs: list[Any]  # the other kinds: one answer per text (docs/PROTOCOL.md; sparse: indices, values bytes)
    tokens: int
    error: str
    status: int
    timing: dict[str, float]  # added by the queue: seconds queued and computing, for the gateway's metrics


# -- batch jobs (the client) -----------------------------------------------------------


class SubmittedItem(TypedDict, total=False):
    """One planned work item; the queue's id for it is ``JOB/KEY``."""

    key: str
    model: str
    op: str  # the operation a worker runs: embed, rerank, ...
    payload: BatchPayload
    rows: int


class JobOptions(TypedDict, total=False):
    """What a job is submitted with, besides its items."""

    lane: Lane  # Lane.BATCH unless given
    models: dict[str, SpecFields]  # the specs of the models the job's items name
    lease_seconds: float
    max_attempts: int
    unplaceable_seconds: float  # grace before items no worker can host go to dead letters
    context: JobContext  # sent once per pull with the job's items (storage options, output format)
    client: str  # the Dask client id: its jobs are dropped when it leaves


class SubmitReply(TypedDict):
    job: str
    items: int


class JobStatus(TypedDict, total=False):
    job: str
    items: int
    queued: int
    leased: int
    done: int
    failed: int
    rows_total: int
    rows_done: int
    rows_by_worker: dict[str, int]
    complete: bool
    elapsed: float
    dead_letters: list[DeadLetter]
    results: list[ItemResult]  # when asked for
    models: dict[str, dict[str, int]]  # item states per model (in the overview only)


class ReleaseReply(TypedDict):
    released: bool


class QueueDepths(TypedDict):
    online: int
    batch: int


class WorkerSummary(TypedDict):
    held: list[str]
    loaded: list[str]
    budget: int | None
    free_bytes: int | None


class Overview(TypedDict):
    """What `shoal status`, the dashboard and the metrics read."""

    queues: dict[str, QueueDepths]
    leased: dict[str, int]  # leased items per worker
    workers: dict[str, WorkerSummary]
    jobs: dict[str, JobStatus]
    counts: dict[str, int]  # items leased, acked, failed, lost, expired, dead, taken_back, rescued, handed_back
    scaling: ScalingStatus


class ScalingStatus(TypedDict):
    """The worker count Dask's autoscalers are told, and why (scheduler_plugins/elastic.py)."""

    target: int
    current: int  # workers connected now
    reason: str  # e.g. "backlog of 4,000 items of bge-small at 40 rows/s per worker"
    asked_seconds_ago: float | None  # since an autoscaler last asked; None: never (a fixed cluster)
    settings: dict[str, float]  # Dask config shoal.adaptive.*


class GatewayStarted(TypedDict, total=False):
    url: str
    error: str  # another gateway already runs on this scheduler


class GatewayStopped(TypedDict):
    stopped: bool


# -- pulls (the workers) --------------------------------------------------------------


class WorkerReport(TypedDict, total=False):
    """What a worker says of itself with every batch pull, so placement sees its present state."""

    held: list[str]
    loaded: list[str]
    budget: int | None  # bytes its models may use
    free_bytes: int | None
    load_seconds: dict[str, float]  # measured load time per model
    pinned: list[str]  # models it keeps loaded, never evicted: scale-down keeps a holder of each


class ItemMessage(TypedDict):
    """A leased item as a worker receives it."""

    id: str
    job: str  # its owner's id: its batch job's (whose context the pull sends), or "online-MODEL"
    model: str
    op: str
    lane: Lane  # an online request or a batch item: which stages run it
    payload: Payload
    rows: int  # its inputs: rows of a batch item's slice, texts (documents, images) of an online request
    attempt: int
    lease_seconds: float


class PullReply(TypedDict, total=False):
    items: list[ItemMessage]
    models: dict[str, SpecFields]  # the items' model specs
    contexts: dict[str, JobContext]  # the items' jobs' contexts (batch pulls)
    demand: dict[str, list[int]]  # per model the worker holds: [waiting items, holders] (batch pulls)
    reason: str  # why nothing came: "unknown worker"


# Acks and failures travel as MessagePack arrays (a list on arrival, which unpacks as the tuple would).
# An online request's ack, (item id, result, compute seconds of its group): sent with the worker's
# next online pull, or among its events when no pull is due soon.
OnlineAck = tuple[str, OnlineResult, float]
ItemAck = tuple[str, ItemResult]  # a batch item's: (item id, result)
ItemFailure = tuple[str, str, bool]  # (item id, error, permanent)


class WorkerEvents(TypedDict, total=False):
    """What a worker tells the queue one way (op ``EVENTS``), gathered over one flush.

    Handled in this order: starts, acks, failures, renewals. Items the worker
    no longer holds (taken back, expired, finished elsewhere) are answered
    with a ``REVOKE`` message, not a reply.
    """

    started: list[str]  # item ids whose compute began
    acks: list[ItemAck]
    failed: list[ItemFailure]
    extend: list[str]  # item ids whose leases to renew
    online_acks: list[OnlineAck]  # those that could not ride on an online pull


# -- gateways in their own processes ----------------------------------------------------

# A request: (request id, model, op, payload, rows, timeout seconds[, flow]); an answer: (request id, outcome).
# `flow` names the request a part belongs to (gateway/request_parts): the parts of one request share a fair
# share of the queue (model_queues). Without it, a request is a flow of its own.
RemoteRequest = tuple[int, str, str, OnlinePayload, int, float] | tuple[int, str, str, OnlinePayload, int, float, str]
RemoteAnswer = tuple[int, OnlineResult]


class RemoteSettings(TypedDict):
    """The gateway's limits its requests are queued under (configs.GatewaySettings fields)."""

    request_timeout_seconds: float
    max_attempts: int
    max_queue_depth: int
    max_inputs: int  # with max_documents: the longest deadline a request may have (GatewaySettings.longest_deadline)
    max_documents: int


class RemoteQueued(TypedDict):
    queued: int


class RemoteAnswers(TypedDict):
    answers: list[RemoteAnswer]
    workers: int
    specs: int  # the version of the model specs: a gateway refreshes them when it changes


class RemoteModels(TypedDict):
    models: dict[str, SpecFields]
    specs: int
    workers: int
    workers_coming: bool  # an autoscaler may add workers: with none connected, requests wait for one
    loaded: dict[str, int]  # workers with each model loaded


class PullQueueClient:
    """One method per handler of the pull queue.

    `scheduler` is an rpc to the scheduler: a Worker's ``worker.scheduler`` or
    a Client's ``client.scheduler``. Methods are coroutines; a blocking
    client runs them with ``client.sync(queue.job_status, job)``.
    """

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    # -- batch jobs --------------------------------------------------------------------

    async def submit(self, job: str, items: list[SubmittedItem], options: JobOptions) -> SubmitReply:
        return await self.scheduler.shoal_submit(job=job, items=items, options=options)

    async def job_status(self, job: str, results: bool = False) -> JobStatus:
        return await self.scheduler.shoal_job_status(job=job, results=results)

    async def job_release(self, job: str) -> ReleaseReply:
        return await self.scheduler.shoal_job_release(job=job)

    async def overview(self) -> Overview:
        return await self.scheduler.shoal_overview()

    async def gateway_start(
        self, settings: GatewayFields, models: dict[str, SpecFields], replace: bool = False
    ) -> GatewayStarted:
        return await self.scheduler.shoal_gateway_start(settings=settings, models=models, replace=replace)

    async def gateway_stop(self) -> GatewayStopped:
        return await self.scheduler.shoal_gateway_stop()

    # -- workers ---------------------------------------------------------------------------

    async def pull(
        self, address: str, room: int, in_hand: int, timeout: float, report: WorkerReport, events: WorkerEvents
    ) -> PullReply:
        """Up to `room` batch items for the worker at `address`, waiting up to `timeout` for some; `events`:
        the worker's gathered events, handled first (one message fewer than on the stream)."""
        return await self.scheduler.shoal_pull(
            worker=address, room=room, in_hand=in_hand, timeout=timeout, events=events, **report
        )

    async def retire(self, address: str, timeout: float, events: WorkerEvents) -> int:
        """Drain the worker at `address` of Shoal's work within `timeout` (elastic.Elastic.drain); `events`: its
        gathered events, handled first. The items still running then, handed back."""
        return await self.scheduler.shoal_retire(worker=address, timeout=timeout, events=events)

    async def scaling(self) -> ScalingStatus:
        return await self.scheduler.shoal_scaling()

    async def pull_online(
        self,
        address: str,
        held: list[str],
        loaded: list[str],
        busy: bool,
        timeout: float,
        acks: list[OnlineAck] | None = None,
        online_rows: dict[str, int] | None = None,
    ) -> PullReply:
        """The waiting online requests of one model, as many inputs as the worker computes in a round
        (`online_rows`); `acks`: the worker's last groups, answered first."""
        return await self.scheduler.shoal_pull_online(
            worker=address,
            held=held,
            loaded=loaded,
            busy=busy,
            timeout=timeout,
            acks=acks or [],
            online_rows=online_rows,
        )

    # -- gateways in their own processes -------------------------------------------------------

    async def online_submit(
        self, gateway: str, requests: list[RemoteRequest], settings: RemoteSettings | None, cancel: list[int]
    ) -> RemoteQueued:
        return await self.scheduler.shoal_online_submit(
            gateway=gateway, requests=requests, settings=settings, cancel=cancel
        )

    async def online_answers(self, gateway: str, timeout: float) -> RemoteAnswers:
        return await self.scheduler.shoal_online_answers(gateway=gateway, timeout=timeout)

    async def online_models(self, models: dict[str, SpecFields] | None = None) -> RemoteModels:
        return await self.scheduler.shoal_online_models(models=models)
