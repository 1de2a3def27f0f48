"""A model's named prompts: the text its authors put before each input, as sentence-transformers keeps them.

Asymmetric retrieval models want one prefix on queries and another on
documents (E5's ``query: ``/``passage: ``, nomic's ``search_query: ``...).
sentence-transformers stores them as ``prompts`` (name -> text) and a
``default_prompt_name`` in ``config_sentence_transformers.json``; a catalog
entry may lay its own over them. Every runtime, the gateway and the CLI pick
the text through `ModelPrompts.text`, which follows ``encode``: an explicit
prompt wins, else the named one, else the default, else none. As in
sentence-transformers, ``query`` and ``document`` are names every embedder
has (empty unless its config sets them), and a prompt counts towards the
model's token window (the text is cut, never the prompt's share).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from . import ConfigError, ModelSpec
from .kinds import kind_of
from .model_resolution import ModelFiles

IMPLICIT_NAMES = ("query", "document")
# The names `encode_query` / `encode_document` look for, in order.
ROLE_NAMES: dict[str, tuple[str, ...]] = {"query": ("query",), "document": ("document", "passage", "corpus")}

Role = Literal["query", "document"]


class PromptError(ConfigError):
    """An unknown prompt name, or a name and a text both given: the user's to fix (exit 2, HTTP 400)."""


@dataclass(frozen=True)
class ModelPrompts:
    model: str
    named: dict[str, str] = field(default_factory=dict)
    default_name: str | None = None

    def __post_init__(self) -> None:
        if self.default_name is not None and self.default_name not in self.named:
            raise ConfigError(
                f"model {self.model!r}: default_prompt_name {self.default_name!r} is not one of its prompts "
                f"({self._listing()})"
            )

    def text(self, name: str | None = None, prompt: str | None = None) -> str:
        """What goes before each input: `prompt` as given, else the prompt called `name`, else the default."""
        if name is not None and prompt is not None:
            raise PromptError("give a prompt name or a prompt text, not both")
        if prompt is not None:
            return prompt
        if name is None:
            return self.named[self.default_name] if self.default_name else ""
        if name in self.named:
            return self.named[name]
        if name in IMPLICIT_NAMES:
            return ""
        shown = repr(name[:200]) + (f"… ({len(name)} characters)" if len(name) > 200 else "")  # a client's: cut
        raise PromptError(f"model {self.model!r} has no prompt named {shown}; it has: {self._listing()}")

    def for_role(self, role: Role) -> str | None:
        """The name of the model's own non-empty prompt for queries or documents, if it has one."""
        return next((name for name in ROLE_NAMES[role] if self.named.get(name)), None)

    def _listing(self) -> str:
        names = sorted({*self.named, *IMPLICIT_NAMES})
        return ", ".join(f"{n} ({self.named[n]!r})" if self.named.get(n) else f"{n} (empty)" for n in names)


def model_prompts(spec: ModelSpec) -> ModelPrompts:
    """`spec`'s prompts: its model's files' (a kind whose `prompts_from_files`), with the catalog entry's laid over them."""
    named: dict[str, str] = {}
    default = None
    if kind_of(spec).prompts_from_files:
        named, default = ModelFiles(Path(spec.resolve_path())).prompts()
    return ModelPrompts(spec.name, {**named, **(spec.prompts or {})}, spec.default_prompt_name or default)
