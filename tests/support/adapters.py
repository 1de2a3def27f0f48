"""Tiny LoRA adapters for tests: PEFT folders over the tiny models of tests/support, and PEFT's own outputs.

Each adapter is what `PeftModel.save_pretrained` writes (adapter_config.json naming its base's folder,
adapter_model.safetensors) for the transformers model its base's library loads: a sentence-transformers
model's inner one for an embedder or a cross-encoder, the bare model for a classifier. Its LoRA matrices are
random (PEFT's `init_lora_weights=False`) and seeded, so every adapter moves the outputs, each its own way.
A classifier's adapter also carries its own head (`modules_to_save`), as PEFT's sequence- and
token-classification tasks save one.

The reference outputs (`peft_*`) come from a fresh copy of the base with `PeftModel.from_pretrained` over
it, that adapter active, through the library's own call: `encode`, `predict`, or the transformers model and
the pipeline's function of its logits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

LORA_TARGETS = ["query", "value"]


def _transformers_model(base: Path, kind: str) -> Any:
    """The transformers model of `base`, loaded as Shoal's runtime for `kind` loads it."""
    if kind == "embedder":
        from sentence_transformers import SentenceTransformer

        return SentenceTransformer(str(base), device="cpu", local_files_only=True), "transformers_model"
    if kind == "reranker":
        from sentence_transformers import CrossEncoder

        return CrossEncoder(str(base), device="cpu", local_files_only=True), "transformers_model"
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification

    auto = AutoModelForTokenClassification if kind == "token_classifier" else AutoModelForSequenceClassification
    return auto.from_pretrained(str(base), local_files_only=True), None


def build_lora(base: Path, target: Path, kind: str, seed: int = 0, rank: int = 4, scale: float = 0.2) -> Path:
    """A LoRA adapter over the tiny model `base` of `kind`, saved in `target` (created)."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    loaded, attribute = _transformers_model(base, kind)
    model = getattr(loaded, attribute) if attribute else loaded
    task = {"classifier": "SEQ_CLS", "token_classifier": "TOKEN_CLS"}.get(kind)  # PEFT then saves the head too
    config = LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=LORA_TARGETS, init_lora_weights=False, task_type=task
    )
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_" in name:
                parameter.normal_(0.0, scale)
            elif "modules_to_save" in name:
                parameter.add_(torch.randn_like(parameter) * scale / 10)
    peft_model.save_pretrained(str(target))
    return target


def build_loras(base: Path, root: Path, kind: str, count: int, first_seed: int = 0) -> list[Path]:
    """`count` adapters over `base`, root/lora-0 ... (the folder name is the adapter's name)."""
    return [build_lora(base, root / f"lora-{i}", kind, seed=first_seed + i) for i in range(count)]


def _peft_over(base: Path, kind: str, adapter: Path | None) -> Any:
    """A fresh copy of `base` with `adapter` over it (None: the base alone), PEFT's way: what Shoal must equal."""
    from peft import PeftModel

    loaded, attribute = _transformers_model(base, kind)
    if adapter is None:
        return loaded
    if attribute:
        PeftModel.from_pretrained(getattr(loaded, attribute), str(adapter)).eval()  # its layers, in place
        return loaded
    return PeftModel.from_pretrained(loaded, str(adapter)).eval()


def peft_embeddings(base: Path, adapter: Path | None, texts: list[str]) -> np.ndarray:
    return np.asarray(_peft_over(base, "embedder", adapter).encode(texts, convert_to_numpy=True), dtype=np.float32)


def peft_scores(base: Path, adapter: Path | None, pairs: list[tuple[str, str]]) -> np.ndarray:
    model = _peft_over(base, "reranker", adapter)
    return np.asarray(model.predict(pairs, convert_to_numpy=True, show_progress_bar=False), dtype=np.float32)


def peft_logits(base: Path, adapter: Path | None, texts: list[str], kind: str) -> list[np.ndarray]:
    """Each text's logits (a row; a token classifier's: one row per token) from PEFT's model."""
    import torch
    from transformers import AutoTokenizer

    model = _peft_over(base, kind, adapter)
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    out = []
    with torch.inference_mode():
        for text in texts:
            out.append(model(**tokenizer(text, return_tensors="pt")).logits[0].float().numpy())
    return out


def peft_entities(base: Path, adapter: Path | None, texts: list[str]) -> list[list[tuple[str, int, int]]]:
    """Each text's (label, start, end) spans from transformers' token-classification pipeline over PEFT's model."""
    from transformers import AutoTokenizer, pipeline

    model = _peft_over(base, "token_classifier", adapter)
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    reference: Any = pipeline("token-classification", model=model, tokenizer=tokenizer, aggregation_strategy="simple")
    return [[(str(e["entity_group"]), int(e["start"]), int(e["end"])) for e in row] for row in reference(texts)]


def build_lora_fleet(base: Path, root: Path, kind: str, count: int, seed: int = 0) -> list[Path]:
    """`count` adapters over `base`: one built by PEFT, the others its copies with their own random LoRA
    matrices (the same tensor names and shapes, in safetensors as PEFT saves them): hundreds in seconds."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    first = build_lora(base, root / "lora-0", kind, seed=seed)
    weights = load_file(str(first / "adapter_model.safetensors"))
    fleet = [first]
    generator = torch.Generator().manual_seed(seed + 1)
    for i in range(1, count):
        folder = root / f"lora-{i}"
        folder.mkdir(parents=True)
        shutil.copy(first / "adapter_config.json", folder / "adapter_config.json")
        fresh = {
            name: torch.randn(tensor.shape, generator=generator) * 0.2 if "lora_" in name else tensor
            for name, tensor in weights.items()
        }
        save_file(fresh, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
        fleet.append(folder)
    return fleet
