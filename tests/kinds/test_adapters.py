"""LoRA adapters (issue 42) on the worker's runtimes: every kind that takes adapters, several adapters mixed in
one call, each input's output equal to PEFT's model with that adapter active (fp32), the base's rows equal to
the base alone, adapters added and removed between calls, refusals of an adapter that does not fit.

Each base is a tiny model (tests/support); its adapters are PEFT folders built over it (tests/support/adapters.py).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from shoal.configs import ModelSpec, load_catalog
from shoal.workers.batching.device_thread import DeviceThread
from shoal.workers.devices import DevicePlan
from tests.support.adapters import build_loras, peft_embeddings, peft_logits, peft_scores
from tests.support.classifier_models import BIO, SENTIMENT, build_tiny_sequence_classifier, build_tiny_token_classifier
from tests.support.models import catalog_yaml

PLAN = DevicePlan("cpu", "cpu", "float32", 10**9, 1)
ADAPTERS = 3


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, tiny_reranker: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapter-bases")
    return {
        "embedder": tiny_model,
        "reranker": tiny_reranker,
        "classifier": build_tiny_sequence_classifier(root / "classifier", SENTIMENT),
        "token_classifier": build_tiny_token_classifier(root / "tokens", BIO),
    }


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory, bases: dict[str, Path]) -> dict[str, list[Path]]:
    root = tmp_path_factory.mktemp("adapters")
    return {kind: build_loras(base, root / kind, kind, ADAPTERS, first_seed=10) for kind, base in bases.items()}


@pytest.fixture(scope="module")
def catalog_path(tmp_path_factory: pytest.TempPathFactory, bases, adapters) -> Path:
    """Each base by its kind's name, each adapter as a catalog entry named by its folder (lora-0 ...)."""
    entries: dict[str, dict] = {kind: {"source": str(base)} for kind, base in bases.items()}
    for kind, folders in adapters.items():
        for folder in folders:
            entries[f"{kind}+{folder.name}"] = {"source": str(folder)}
    path = tmp_path_factory.mktemp("adapter-catalog") / "catalog.yaml"
    path.write_text(catalog_yaml(entries))
    return path


def _attached(spec_names: list[str], catalog_path: Path):
    """The worker's way: a pool over a device thread, each adapter attached over its base (run on a loop)."""
    from shoal.workers.model_pool import ModelPool
    from shoal.workers.runtimes import load_model
    from shoal.workers.runtimes.lora import AdapterLoader

    catalog = load_catalog(catalog_path)
    device = DeviceThread()
    io = ThreadPoolExecutor(1)
    pool = ModelPool(10**9, lambda spec: load_model(spec, PLAN, device), io, AdapterLoader(device, io))
    specs: list[ModelSpec] = [catalog.get(name) for name in spec_names]

    async def load():
        runtimes = []
        for spec in specs:
            async with pool.use(spec) as runtime:
                runtimes.append(runtime)
        return runtimes

    return asyncio.run(load()), pool, device


TEXTS = [
    "Alice Smith of Acme Corporation met the mayor of Paris.",
    "short",
    "A somewhat longer sentence, about LoRA adapters served over one base model at once.",
    "Café déjà vu 東京",
    "the cat sat on the mat",
    "x " * 40,
]


def _mixed(names: list[str], count: int) -> list[str | None]:
    """Each input's adapter, every adapter and the base (None) interleaved."""
    cycle = [*names, None]
    return [cycle[i % len(cycle)] for i in range(count)]


def test_embedder_adapters_mixed_in_one_call_equal_peft(catalog_path, bases, adapters):
    names = [f"embedder+lora-{i}" for i in range(ADAPTERS)]
    runtimes, pool, device = _attached(names, catalog_path)
    base = runtimes[0].base
    per_input = _mixed([f"lora-{i}" for i in range(ADAPTERS)], len(TEXTS) * 3)
    texts = (TEXTS * 3)[: len(per_input)]
    vectors, _ = device.run(base.embed, texts, None, None, per_input).result()
    references = {None: peft_embeddings(bases["embedder"], None, TEXTS)}
    references |= {
        f"lora-{i}": peft_embeddings(bases["embedder"], path, TEXTS) for i, path in enumerate(adapters["embedder"])
    }
    for row, (text, adapter) in enumerate(zip(texts, per_input)):
        expected = references[adapter][TEXTS.index(text)]
        cosine = float(vectors[row] @ expected / np.linalg.norm(vectors[row]) / np.linalg.norm(expected))
        assert cosine >= 0.9999, (adapter, text, cosine)
    # One adapter's own runtime (what a single-adapter item computes with) gives its adapter's vectors.
    alone, _ = device.run(runtimes[1].embed, TEXTS).result()
    np.testing.assert_allclose(alone, references["lora-1"], atol=1e-5)
    assert not np.allclose(references["lora-0"], references[None], atol=1e-3)  # the adapters do move the vectors
    device.shutdown()


def test_reranker_adapters_mixed_in_one_call_equal_peft(catalog_path, bases, adapters):
    runtimes, pool, device = _attached([f"reranker+lora-{i}" for i in range(ADAPTERS)], catalog_path)
    base = runtimes[0].base
    pairs = [(TEXTS[i], TEXTS[(i + 1) % len(TEXTS)]) for i in range(len(TEXTS))]
    per_input = _mixed([f"lora-{i}" for i in range(ADAPTERS)], len(pairs))
    scores, _ = device.run(base.score, [q for q, _ in pairs], [p for _, p in pairs], None, per_input).result()
    for row, adapter in enumerate(per_input):
        folder = adapters["reranker"][int(adapter[-1])] if adapter else None
        np.testing.assert_allclose(scores[row], peft_scores(bases["reranker"], folder, [pairs[row]])[0], atol=1e-5)
    device.shutdown()


@pytest.mark.parametrize("kind", ["classifier", "token_classifier"])
def test_classifier_adapters_mixed_in_one_forward_equal_peft(catalog_path, bases, adapters, kind):
    runtimes, pool, device = _attached([f"{kind}+lora-{i}" for i in range(ADAPTERS)], catalog_path)
    base = runtimes[0].base
    per_input = _mixed([f"lora-{i}" for i in range(ADAPTERS)], len(TEXTS))

    def logits() -> list[np.ndarray]:
        """The runtime's own forward, through its batching and its adapters' rows."""
        out = []
        for row, text in enumerate(TEXTS):
            features = base.encode_batch([text])
            with base.through(per_input, np.array([row])):
                out.append(base.model(**features).logits[0].detach().float().numpy())
        return out

    got = device.run(logits).result()
    for row, adapter in enumerate(per_input):
        folder = adapters[kind][int(adapter[-1])] if adapter else None
        np.testing.assert_allclose(got[row], peft_logits(bases[kind], folder, [TEXTS[row]], kind)[0], atol=1e-5)
    device.shutdown()
