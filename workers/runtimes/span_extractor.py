"""The zero-shot span extractor runtime: a GLiNER model, its entity labels named per job or request.

GLiNER encodes the label names beside the text and scores every span of up
to `max_width` words against each of them, so one model finds whatever
entities a caller names (``--labels person,organization``): SIE's
``extract``. Spans, labels, scores and character offsets are what
``GLiNER.inference`` gives for the same texts, labels and threshold; the
texts go in token-budget batches, one model call each on the device thread.
GLiNER reads at most its `max_len` words of a text (its own word splitter);
a longer text is cut there and counted as truncated.

The `gliner` package (0.2.29) declares ``transformers<5.17``; it runs on the
transformers Shoal installs, so it is installed without its dependencies
(``pip install --no-deps gliner``: the Makefile does, docs/DEPLOY.md says why).
"""

from __future__ import annotations

from ...configs import ModelSpec
from ..batching.device_thread import DeviceThread
from ..batching.token_batching import Measured
from ..devices import DevicePlan
from .text_model import TextModel
from .token_classifier import Entity

DEFAULT_THRESHOLD = 0.5  # GLiNER's own: a span scoring below it is no entity


class SpanExtractor(TextModel):
    def __init__(
        self, spec: ModelSpec, plan: DevicePlan, device_thread: DeviceThread | None = None, dtype: str | None = None
    ) -> None:
        try:
            from gliner import GLiNER
        except ImportError:
            raise ValueError(
                f"model {spec.name!r} is a GLiNER span extractor: install it with `pip install --no-deps gliner`"
            ) from None
        model = GLiNER.from_pretrained(spec.resolve_path(), local_files_only=True, map_location=plan.device)
        super().__init__(spec, plan, model, model.data_processor.transformer_tokenizer, device_thread, dtype)
        self.max_words = int(model.config.max_len)
        self._words = model.data_processor.words_splitter

    def token_lengths(self, texts: list[str]) -> Measured:
        """Token counts (for batching), and how many texts pass GLiNER's `max_len` words (it cuts them)."""
        lengths, _ = super().token_lengths(texts)
        return lengths, sum(1 for text in texts if self._over_max_words(text))

    def entities(
        self, texts: list[str], labels: list[str], threshold: float | None = None, multi_label: bool = False
    ) -> tuple[list[list[Entity]], int]:
        """Each text's spans of `labels` scoring at least `threshold`, in order of their start, and how many
        texts were cut at `max_len` words. `multi_label`: a span may carry more than one label."""
        if not labels:
            raise ValueError(f"model {self.spec.name!r} finds the entities it is asked for: name their labels")
        cut = DEFAULT_THRESHOLD if threshold is None else threshold
        return self.in_rows(texts, lambda batch: self._forward(batch, labels, cut, multi_label))

    def _forward(self, texts: list[str], labels: list[str], threshold: float, multi_label: bool) -> list[list[Entity]]:
        import torch

        with torch.inference_mode():
            found = self.model.inference(
                texts, labels, threshold=threshold, multi_label=multi_label, batch_size=len(texts)
            )
        return [
            sorted(
                (Entity(text[e["start"] : e["end"]], e["label"], float(e["score"]), e["start"], e["end"]) for e in row),
                key=lambda entity: (entity.start, entity.end),
            )
            for text, row in zip(texts, found, strict=True)
        ]

    def _over_max_words(self, text: str) -> bool:
        for count, _ in enumerate(self._words(text), start=1):
            if count > self.max_words:
                return True
        return False
