"""Tiny sparse and multi-vector models for tests: random weights, the layouts their libraries save.

- `build_tiny_splade`: a BERT with its masked-LM head, saved as a sentence-transformers SparseEncoder folder
  (the fill-mask Transformer, SpladePooling max), as SPLADE models on the hub are. The head's bias is shifted
  so a row keeps tens to hundreds of terms above zero after ReLU and max pooling, as a trained SPLADE's do.
- `build_tiny_colbert`: a BERT and a Dense projection saved the way PyLate saves a ColBERT model (the
  transformer at the folder's root, ``1_Dense`` with PyLate's Dense type, the query and document prefix
  tokens, query length, document length and punctuation skiplist in config_sentence_transformers.json).
- `direct_colbert`: ColBERT's computation written out on those weights, the reference the folder is held to.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import numpy as np

from tests.support.models import TINY_DIM, TINY_MAX_SEQ, _seeded_bert

COLBERT_DIM = 16
COLBERT_DOCUMENT_LENGTH = 64
COLBERT_QUERY_LENGTH = 24
COLBERT_PREFIXES = {"query": "[unused0]", "document": "[unused1]"}


def build_tiny_splade(target: Path, seed: int = 0) -> Path:
    import torch
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder.models import SpladePooling
    from transformers import BertForMaskedLM

    backbone, config = _seeded_bert(target, seed, TINY_DIM)
    mlm = BertForMaskedLM(config)
    with torch.no_grad():  # a probe text's logits over the vocabulary, shifted so 1 in 10,000 is positive
        probe = mlm(input_ids=torch.arange(100, 164)[None]).logits.flatten()
        mlm.cls.predictions.bias -= torch.quantile(probe, 0.9999)
    mlm.save_pretrained(backbone)
    transformer = Transformer(str(backbone), transformer_task="fill-mask", max_seq_length=TINY_MAX_SEQ)
    model = SparseEncoder(modules=[transformer, SpladePooling("max")], device="cpu")
    out = target / "model"
    model.save(str(out))
    return out


def build_tiny_colbert(target: Path, seed: int = 0) -> Path:
    import torch
    from safetensors.torch import save_file
    from transformers import BertModel

    backbone, config = _seeded_bert(target, seed, TINY_DIM)
    BertModel(config).save_pretrained(backbone)
    out = backbone.rename(target / "model")
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 179, "do_lower_case": False}))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
    ]
    (out / "modules.json").write_text(json.dumps(modules))
    dense = out / "1_Dense"
    dense.mkdir()
    linear = {"in_features": TINY_DIM, "out_features": COLBERT_DIM, "bias": False}
    activation = "torch.nn.modules.linear.Identity"
    (dense / "config.json").write_text(json.dumps({**linear, "activation_function": activation, "use_residual": False}))
    save_file({"linear.weight": torch.randn(COLBERT_DIM, TINY_DIM)}, str(dense / "model.safetensors"))
    colbert = {
        "model_type": "ColBERT",
        "query_prefix": COLBERT_PREFIXES["query"],
        "document_prefix": COLBERT_PREFIXES["document"],
        "query_length": COLBERT_QUERY_LENGTH,
        "document_length": COLBERT_DOCUMENT_LENGTH,
        "attend_to_expansion_tokens": False,
        "skiplist_words": list(string.punctuation),
        "do_query_expansion": True,
        "similarity_fn_name": "MaxSim",
        "prompts": {},
        "default_prompt_name": None,
    }
    (out / "config_sentence_transformers.json").write_text(json.dumps(colbert))
    return out


def direct_colbert(folder: Path, text: str, input_type: str = "document") -> np.ndarray:
    """ColBERT's vectors for one text, computed by hand as PyLate does: [CLS], the prefix token, the text's
    tokens, [SEP]; a query padded with [MASK] to the query length (not attended to, all kept); the
    transformer, the linear projection, L2 per token; a document's padding and punctuation dropped."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    bert = AutoModel.from_pretrained(folder).eval()
    weight = load_file(str(folder / "1_Dense" / "model.safetensors"))["linear.weight"]
    query = input_type == "query"
    length = COLBERT_QUERY_LENGTH if query else COLBERT_DOCUMENT_LENGTH
    ids = tokenizer(text, truncation=True, max_length=length - 1)["input_ids"]
    ids = [ids[0], tokenizer.convert_tokens_to_ids(COLBERT_PREFIXES[input_type]), *ids[1:]]
    attention = [1] * len(ids)
    if query:
        pad = length - len(ids)
        ids, attention = ids + [tokenizer.mask_token_id] * pad, attention + [0] * pad
    with torch.no_grad():
        hidden = bert(input_ids=torch.tensor([ids]), attention_mask=torch.tensor([attention])).last_hidden_state[0]
    vectors = torch.nn.functional.normalize(hidden @ weight.T, dim=-1).numpy()
    if query:
        return vectors
    skip = {tokenizer.convert_tokens_to_ids(word) for word in string.punctuation}
    return vectors[[i not in skip for i in ids]]
