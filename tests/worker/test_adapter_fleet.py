"""200 adapters of one tiny base served from one worker (issue 42): one burst of online requests, one per
adapter, all answered; the base loaded once and each adapter once (twice only where the LRU evicted it first);
the pool's memory the base's plus each adapter's measured bytes, and the process's resident memory growing by
about that, not by copies of the base.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shoal.configs import load_catalog, load_profile
from shoal.configs.adapters import PEFT_MODULE_BYTES, lora_modules, tensor_shapes
from tests.support.adapters import build_lora_fleet, peft_embeddings
from tests.support.files import write_profile
from tests.support.models import catalog_yaml

FLEET = 200
# Leases of seconds, not 0.5: on a 2-core machine under load a renewal can be late by more, and this test is
# about residency, not how fast a frozen worker's requests move on (tests/scheduler/ test that).
SETTINGS = {"port": 0, "request_timeout_seconds": 600, "online_lease_seconds": 5.0}
TEXT = "One query for each adapter of the fleet."


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> tuple[Path, list[Path]]:
    """A catalog of the tiny embedder `base` and its 200 adapters base+lora-N: (catalog, adapter folders)."""
    root = tmp_path_factory.mktemp("fleet")
    folders = build_lora_fleet(tiny_model, root / "adapters", "embedder", FLEET)
    entries: dict[str, dict] = {"base": {"source": str(tiny_model)}}
    entries |= {f"base+{folder.name}": {"source": str(folder)} for folder in folders}
    (root / "catalog.yaml").write_text(catalog_yaml(entries))
    return root / "catalog.yaml", folders


def _loaded_bytes(folder: Path) -> int:
    """A model's bytes as a worker's runtime measures them (its parameters and buffers)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


@pytest.mark.timeout(900)
def test_two_hundred_adapters_answered_in_one_burst_from_one_worker(fleet, tiny_model, tmp_path):
    """The budget holds them all (the LRU under a smaller one: tests/worker/test_adapter_residency.py)."""
    budget_adapters = FLEET
    from distributed import Client

    from shoal.pipeline.client import AsyncOnlineClient
    from shoal.pipeline.cluster import pull_queue, start_local_cluster

    def _pool_state(dask_worker: Any) -> dict[str, Any]:  # nested: pickled by value, workers cannot import tests/
        import psutil

        pool = dask_worker.plugins["shoal-worker"].pool
        return {
            "rss": psutil.Process().memory_info().rss,
            "used": pool.used_bytes(),
            "budget": pool.budget,
            "sizes": dict(pool._sizes),
            "load_counts": dict(pool.load_counts),
            "load_seconds": dict(pool.load_seconds),
            "evictions": list(pool.evictions),
        }

    catalog_path, folders = fleet
    catalog = load_catalog(catalog_path)
    adapter = catalog.get("base+lora-0").adapter
    assert adapter is not None
    adapter_bytes = adapter.memory_bytes
    # The worker's budget (MEMORY x memory_fraction 0.5): the base as the worker will measure it, and
    # `budget_adapters` adapters.
    budget = _loaded_bytes(tiny_model) + budget_adapters * adapter_bytes + adapter_bytes // 2
    profile = load_profile(str(write_profile(tmp_path, workers=1)))
    models = {name: spec.model_dump() for name, spec in catalog.models.items()}
    with (
        start_local_cluster(profile, str(catalog_path), resources={"MEMORY": 2 * budget}) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(1)
        url = client.sync(
            pull_queue(client).gateway_start,
            settings=SETTINGS,
            models=models,
            replace=True,
        )["url"]

        async def ask(models: list[str]) -> list[np.ndarray]:
            async with AsyncOnlineClient(url, timeout=300) as online:
                return await asyncio.gather(*(online.encode(model, [TEXT]) for model in models))

        (base_vector,) = client.sync(ask, ["base"])  # the base loads first: memory is measured from here
        before = next(iter(client.run(_pool_state).values()))
        vectors = client.sync(ask, [f"base+lora-{i}" for i in range(FLEET)])  # one burst, every adapter
        after = next(iter(client.run(_pool_state).values()))
        client.sync(pull_queue(client).gateway_stop)
    assert len(vectors) == FLEET and all(v.shape == base_vector.shape for v in vectors)
    for i in (0, 1, FLEET // 2, FLEET - 1):  # a sample, each against PEFT's own model
        np.testing.assert_allclose(vectors[i], peft_embeddings(tiny_model, folders[i], [TEXT]), atol=1e-5)
    assert len({v.tobytes() for v in vectors}) == FLEET  # each adapter its own vector
    counts = after["load_counts"]
    assert counts["base"] == 1 and "base" not in after["evictions"]  # the base once, never evicted
    assert all(counts[f"base+lora-{i}"] == 1 for i in range(FLEET))  # each asked once: loaded once
    measured = after["sizes"]["base+lora-0"]
    resident = [name for name in after["sizes"] if name not in after["evictions"]]
    room = (after["budget"] - after["sizes"]["base"]) // measured  # adapters the budget holds beside the base
    assert len(resident) - 1 == min(FLEET, room) and len(after["evictions"]) == FLEET + 1 - len(resident)
    assert (room >= FLEET) == (budget_adapters == FLEET)  # all resident, or an LRU that evicted
    weights = tensor_shapes(folders[0] / "adapter_model.safetensors")
    matrices = sum(4 * int(np.prod(shape)) for shape in weights.values())  # fp32
    assert measured == matrices + PEFT_MODULE_BYTES * lora_modules(weights)  # and PEFT's objects around them
    assert measured == adapter_bytes  # as the catalog estimated it from the file's header
    assert after["used"] == after["sizes"]["base"] + measured * (len(resident) - 1)
    assert all(after["load_seconds"][f"base+lora-{i}"] > 0 for i in range(FLEET))  # each measured, for placement
    # The process grows by what the pool counts for the adapters, never by a copy of the base per adapter.
    grown, adapted = after["rss"] - before["rss"], len(resident) - 1
    print(  # the figure docs/DEPLOY.md states (LoRA adapters)
        f"one worker, {adapted} resident adapters: pool {after['used'] / 1e6:.2f} MB = base "
        f"{after['sizes']['base'] / 1e6:.2f} MB + {adapted} x {measured} B ({matrices} B of matrices); process RSS "
        f"grew {grown / 1e6:.1f} MB over the burst ({grown / max(adapted, 1) / 1e3:.1f} kB an adapter)"
    )
    assert grown < adapted * measured + BASE_COPY_BYTES


BASE_COPY_BYTES = 16 * 1024 * 1024  # allocator slack, far under what even a few copies of the base would add
