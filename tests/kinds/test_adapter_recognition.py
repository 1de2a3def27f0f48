"""Recognising a LoRA adapter (issue 42): a PEFT folder is a model wherever a model is named (a catalog entry,
a folder, BASE+ADAPTER), named BASE+ADAPTER, of its base's kind; one whose base is missing, of a kind that takes
no adapters, or of another architecture is refused before any work, naming both.

Unit tests: the folders hold what PEFT and transformers write (JSON, and safetensors files whose headers give
each tensor's shape), built here without torch.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from shoal.configs import ConfigError, RuntimeChoice, load_catalog
from shoal.configs.adapters import PEFT_MODULE_BYTES, base_of
from tests.support.models import catalog_yaml

HIDDEN = 32


def write_safetensors(path: Path, shapes: dict[str, list[int]]) -> None:
    """A safetensors file of zeros with these tensors (its header: the format's 8-byte length, then JSON)."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 4 * int(np.prod(shape))
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + bytes(offset))


def write_bert(folder: Path, hidden: int = HIDDEN, architecture: str = "BertModel") -> Path:
    """A bare transformers BERT folder: config.json and its weights' layout (two layers)."""
    folder.mkdir(parents=True)
    config = {"architectures": [architecture], "hidden_size": hidden, "max_position_embeddings": 128}
    (folder / "config.json").write_text(json.dumps(config))
    shapes = {"embeddings.word_embeddings.weight": [100, hidden]}
    for layer in range(2):
        for part in ("query", "key", "value"):
            shapes[f"encoder.layer.{layer}.attention.self.{part}.weight"] = [hidden, hidden]
    write_safetensors(folder / "model.safetensors", shapes)
    return folder


def write_lora(folder: Path, base_reference: str, hidden: int = HIDDEN, module: str = "query", **config) -> Path:
    """What PeftModel.save_pretrained writes for a rank-4 LoRA on each layer's `module`."""
    folder.mkdir(parents=True)
    settings = {"peft_type": "LORA", "base_model_name_or_path": base_reference, "r": 4, **config}
    (folder / "adapter_config.json").write_text(json.dumps(settings))
    shapes = {}
    for layer in range(2):
        path = f"base_model.model.encoder.layer.{layer}.attention.self.{module}"
        shapes[f"{path}.lora_A.weight"] = [4, hidden]
        shapes[f"{path}.lora_B.weight"] = [hidden, 4]
    write_safetensors(folder / "adapter_model.safetensors", shapes)
    return folder


@pytest.fixture
def fleet(tmp_path: Path) -> dict[str, Path]:
    base = write_bert(tmp_path / "models" / "bert")
    return {
        "base": base,
        "legal": write_lora(tmp_path / "adapters" / "legal", str(base)),
        "medical": write_lora(tmp_path / "adapters" / "medical", str(base), module="value"),
    }


def catalog_file(tmp_path: Path, entries: dict[str, dict]) -> Path:
    path = tmp_path / "catalog.yaml"
    path.write_text(catalog_yaml(entries))
    return path


def test_a_catalog_adapter_is_a_model_of_its_bases_kind_named_base_plus_adapter(tmp_path, fleet):
    catalog = load_catalog(
        catalog_file(tmp_path, {"bert": {"source": str(fleet["base"])}, "legal": {"source": str(fleet["legal"])}})
    )
    spec = catalog.get("bert+legal")
    base = catalog.get("bert")
    assert spec.name == "bert+legal" and "legal" not in catalog.models
    assert spec.adapter is not None and spec.adapter.base == "bert" and spec.adapter.name == "legal"
    assert (spec.kind, spec.dim, spec.max_seq_length, spec.source) == (base.kind, HIDDEN, 128, base.source)
    # Its tensors' bytes (2 layers x A and B, fp32) and PEFT's objects around each of the 2 adapted modules.
    assert spec.adapter.memory_bytes == 2 * 2 * (4 * HIDDEN) * 4 + 2 * PEFT_MODULE_BYTES
    # What a worker loads once for all of them: the base, pinned to torch (LoRA layers live in the torch model).
    torch = RuntimeChoice(runtime="torch")
    assert base_of(spec) == base.model_copy(update={"runtimes": {"cpu": torch, "cuda": torch}})


def test_an_adapter_folder_or_base_plus_folder_is_accepted_as_a_model(tmp_path, fleet):
    catalog = load_catalog(catalog_file(tmp_path, {"bert": {"source": str(fleet["base"])}}))
    by_folder = catalog.get(str(fleet["medical"]))  # its base found by the catalog entry's source
    assert by_folder.name == "bert+medical" and by_folder.adapter is not None
    by_name = catalog.get(f"bert+{fleet['legal']}")
    assert by_name.name == "bert+legal" and by_name.adapter is not None
    assert by_name.adapter.source == str(fleet["legal"])
    # Without a catalog entry for its base, the base is the folder the adapter names, by its path.
    alone = load_catalog(catalog_file(tmp_path, {})).get(str(fleet["legal"]))
    assert alone.name == f"{fleet['base']}+legal"


def test_an_adapter_whose_base_is_missing_is_refused_naming_both(tmp_path):
    adapter = write_lora(tmp_path / "orphan", str(tmp_path / "gone"))
    with pytest.raises(ConfigError, match=rf"adapter {adapter} names base model '{tmp_path / 'gone'}'.*not here"):
        load_catalog(catalog_file(tmp_path, {})).get(str(adapter))
    with pytest.raises(ConfigError, match=r"models.orphan: adapter .* names base model"):
        load_catalog(catalog_file(tmp_path, {"orphan": {"source": str(adapter)}}))


@pytest.mark.parametrize(
    "hidden,module,problem",
    [
        (64, "query", r"its .*query.lora_A.weight is \[4, 64\]"),
        (HIDDEN, "dense", "it adapts .*dense.*which 'bert' lacks"),
    ],
)
def test_an_adapter_of_another_architecture_is_refused_naming_both(tmp_path, fleet, hidden, module, problem):
    wider = write_lora(tmp_path / "wider", "some/other-model", hidden=hidden, module=module)
    catalog = load_catalog(catalog_file(tmp_path, {"bert": {"source": str(fleet["base"])}}))
    with pytest.raises(ConfigError, match=rf"adapter {wider} does not fit base model 'bert': {problem}"):
        catalog.get(f"bert+{wider}")
    with pytest.raises(ConfigError, match="another architecture; it names base 'some/other-model'"):
        catalog.get(f"bert+{wider}")


def test_adapters_over_a_kind_without_lora_support_dora_and_unknown_adapters_are_refused(tmp_path, fleet):
    sparse = write_bert(tmp_path / "splade", architecture="BertForMaskedLM")
    (sparse / "config_sentence_transformers.json").write_text(json.dumps({"model_type": "SparseEncoder"}))
    (sparse / "config.json").write_text(
        json.dumps({"vocab_size": 100, "hidden_size": HIDDEN, "max_position_embeddings": 64})
    )
    dora = write_lora(tmp_path / "dora", str(fleet["base"]), use_dora=True)
    entries = {
        "bert": {"source": str(fleet["base"])},
        "splade": {"source": str(sparse)},
        "legal": {"source": str(fleet["legal"])},
    }
    catalog = load_catalog(catalog_file(tmp_path, entries))
    with pytest.raises(ConfigError, match="base model 'splade' is of kind 'sparse'; LoRA adapters are served over"):
        catalog.get(f"splade+{fleet['legal']}")
    with pytest.raises(ConfigError, match="DoRA"):
        catalog.get(str(dora))
    with pytest.raises(ConfigError, match=r"unknown adapter 'nope' in 'bert\+nope'.*adapters are: bert\+legal"):
        catalog.get("bert+nope")


def test_an_adapter_entry_takes_only_source_and_base(tmp_path, fleet):
    entries = {"bert": {"source": str(fleet["base"])}, "legal": {"source": str(fleet["legal"]), "dim": 3}}
    with pytest.raises(ConfigError, match="models.legal: an adapter entry takes only source and base.*not dim"):
        load_catalog(catalog_file(tmp_path, entries))
    renamed = {"bert": {"source": str(fleet["base"])}, "bert+civil": {"source": str(fleet["legal"])}}
    assert "bert+civil" in load_catalog(catalog_file(tmp_path, renamed)).models


def test_a_profile_tunes_an_adapter_as_its_base_and_may_serve_it_merged(tmp_path, fleet):
    from shoal.configs import Profile

    catalog = load_catalog(
        catalog_file(tmp_path, {"bert": {"source": str(fleet["base"])}, "legal": {"source": str(fleet["legal"])}})
    )
    profile = Profile(
        name="p", token_budgets={"bert": 1024, "bert+legal": 99}, max_batch_sizes={"bert": 32},
        merged_adapters=["bert+legal"],
    )  # fmt: skip
    shared = profile.model_copy(update={"merged_adapters": []}).tuned(catalog.get("bert+legal"))
    assert shared.budget_for("cpu") == 1024 and shared.max_batch_size == 32  # its base's: it computes in its batches
    assert shared.adapter is not None and not shared.adapter.merged
    merged = profile.tuned(catalog.get("bert+legal"))
    assert merged.adapter is not None and merged.adapter.merged and merged.budget_for("cpu") == 99  # its own model
