"""The retrieval pipeline's job spec: a YAML file `shoal run` validates before running.

embed corpus -> embed queries -> exact top-k by cosine -> rerank top-k (optional).
Validation errors name the file and the field; relative local paths are
taken relative to the job file, so a job file travels with its data.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ...configs import explain, read_yaml
from ...scheduler_plugins.protocol import StorageOptions
from ...workers.data.chunking import ChunkSettings
from ..jobs.rerank import DEFAULT_MAX_CANDIDATES


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextSource(_Strict):
    """Parquet rows with an id and a text: the corpus, or the queries.

    Their prompt is the model's own for their role (query; document, passage
    or corpus) when it defines one, else its default: `prompt_name` or
    `prompt` (the text; "" for none) overrides it.
    """

    input: str
    text_column: str = "text"
    id_column: str = Field(default="id", min_length=1)
    prompt_name: str | None = None
    prompt: str | None = None

    @model_validator(mode="after")
    def _one_prompt(self) -> TextSource:
        if self.prompt_name is not None and self.prompt is not None:
            raise ValueError("give prompt_name or prompt, not both")
        return self


class EmbedStage(_Strict):
    model: str
    chunk: ChunkSettings | None = None  # corpus texts as token windows; results are still documents


class RetrieveStage(_Strict):
    top_k: int = Field(default=100, gt=0)


class RerankStage(_Strict):
    model: str
    top_k: int = Field(default=100, gt=0)  # how many of the retrieved candidates to rerank
    max_candidates: int = Field(default=DEFAULT_MAX_CANDIDATES, gt=0)


class JobSpec(_Strict):
    name: str = ""
    output: str
    storage_options: StorageOptions = Field(default_factory=dict)
    corpus: TextSource
    queries: TextSource
    embed: EmbedStage
    retrieve: RetrieveStage = Field(default_factory=RetrieveStage)
    rerank: RerankStage | None = None

    @model_validator(mode="after")
    def _rerank_within_retrieved(self) -> JobSpec:
        if self.rerank and self.rerank.top_k > self.retrieve.top_k:
            raise ValueError(f"rerank.top_k ({self.rerank.top_k}) is more than retrieve.top_k ({self.retrieve.top_k})")
        if self.rerank and self.rerank.top_k > self.rerank.max_candidates:
            raise ValueError(
                f"rerank.top_k ({self.rerank.top_k}) is more than rerank.max_candidates ({self.rerank.max_candidates})"
            )
        return self


def load_job_spec(path: str | os.PathLike) -> JobSpec:
    path = Path(path)
    data = read_yaml(path)
    data.setdefault("name", path.stem)
    try:
        spec = JobSpec(**data)
    except ValidationError as exc:
        raise explain(path, exc, root="job") from None
    base = path.resolve().parent
    spec.output = _beside(spec.output, base)
    spec.corpus.input = _beside(spec.corpus.input, base)
    spec.queries.input = _beside(spec.queries.input, base)
    return spec


def _beside(location: str, base: Path) -> str:
    """A relative local path, taken relative to the job file; URLs unchanged."""
    if "://" in location or Path(location).expanduser().is_absolute():
        return location
    return str(base / location)
