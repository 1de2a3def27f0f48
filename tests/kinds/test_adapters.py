"""LoRA adapters (issue 42) on the worker's runtimes: every kind that takes adapters, several adapters mixed in
one call, each input's output equal to PEFT's model with that adapter active (fp32), the base's rows equal to
the base alone, adapters added and removed between calls, refusals of an adapter that does not fit.

Each base is a tiny model (tests/support); its adapters are PEFT folders built over it (tests/support/adapters.py).
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shoal.configs import ModelSpec, load_catalog
from shoal.workers.batching.device_thread import DeviceThread
from shoal.workers.devices import DevicePlan
from tests.support.adapters import build_loras, peft_embeddings, peft_entities, peft_logits, peft_scores
from tests.support.classifier_models import BIO, SENTIMENT, build_tiny_sequence_classifier, build_tiny_token_classifier
from tests.support.models import catalog_yaml

PLAN = DevicePlan("cpu", "cpu", "float32", 10**9, 1)
ADAPTERS = 3  # per kind; the embedder has JOB_ADAPTERS, for a job of that many at once
JOB_ADAPTERS = 8


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
    count = {"embedder": JOB_ADAPTERS}
    return {
        kind: build_loras(base, root / kind, kind, count.get(kind, ADAPTERS), first_seed=10)
        for kind, base in bases.items()
    }


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
    from shoal.workers.runtimes import load_runtime
    from shoal.workers.runtimes.lora import AdapterLoader

    catalog = load_catalog(catalog_path)
    device = DeviceThread()
    io = ThreadPoolExecutor(1)
    pool = ModelPool(10**9, lambda spec: load_runtime(spec, PLAN, device), io, AdapterLoader(device, io))
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
        f"lora-{i}": peft_embeddings(bases["embedder"], path, TEXTS)
        for i, path in enumerate(adapters["embedder"][:ADAPTERS])
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


# -- on the cluster: a job of several adapters, online requests of many at once ---------------------------

ADAPTED = [f"embedder+lora-{i}" for i in range(JOB_ADAPTERS)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, demo_texts: list[str]) -> tuple[Path, dict[int, str | None]]:
    """A corpus unlike the demo's: integer keys, the text in `body`, a `lang` column; one null body; 3 shards."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path_factory.mktemp("hidden-style") / "corpus"
    folder.mkdir()
    bodies: list[str | None] = [*demo_texts[:119], None, "Zürich’s naïve café 🙂", "x" * 900]
    keys = [7000 + 3 * i for i in range(len(bodies))]
    for shard in range(3):
        rows = slice(shard * 41, (shard + 1) * 41)
        table = pa.table({"key": keys[rows], "body": bodies[rows], "lang": ["en"] * len(keys[rows])})
        pq.write_table(table, folder / f"shard-{shard}.parquet", row_group_size=16)
    return folder, dict(zip(keys, bodies))


@pytest.mark.timeout(900)  # jobs on a shared 2-core machine
def test_a_job_of_several_adapters_writes_every_id_once_per_adapter_equal_to_peft(
    cluster, catalog_path, bases, adapters, corpus, tmp_path
):
    """A job of 8 adapters at once over a corpus unlike the demo's (`corpus`): OUTPUT/<model>/ each."""
    from shoal.pipeline.jobs.engine import output_folder
    from tests.support.cli import invoke_shoal, shoal_options
    from tests.support.files import read_output

    _, client = cluster
    folder, bodies = corpus
    result = invoke_shoal(
        "embed", str(folder), str(tmp_path / "out"), "--model", ",".join(ADAPTED),
        "--text-column", "body", "--id-column", "key", "--keep-columns", "lang",
        *shoal_options(catalog_path, client.scheduler.address),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    present = [key for key, body in bodies.items() if body is not None]
    texts = [bodies[key] for key in present]
    for i, name in enumerate(ADAPTED):
        table = read_output(tmp_path / "out" / output_folder(name))
        assert table.column_names == ["key", "embedding", "lang"]
        keys = table.column("key").to_pylist()
        assert sorted(keys) == sorted(bodies)  # every id once, the null body's too (its vector null)
        got = dict(zip(keys, table.column("embedding").to_pylist()))
        vectors = np.array([got[key] for key in present], dtype=np.float32)
        expected = peft_embeddings(bases["embedder"], adapters["embedder"][i], texts)
        cosines = (
            np.sum(vectors * expected, axis=1) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(expected, axis=1)
        )
        assert cosines.min() >= 0.9999, (name, cosines.min())
        manifest = json.loads((tmp_path / "out" / output_folder(name) / "_manifest.json").read_text())
        assert manifest["model"]["name"] == name and manifest["complete"] and manifest["rows"] == len(bodies)
        assert got[min(key for key, body in bodies.items() if body is None)] is None


@pytest.mark.timeout(900)  # jobs on a shared 2-core machine
def test_an_adapters_job_resumes_and_reindexes_into_lance_in_chunks_as_any_models(
    cluster, catalog_path, bases, adapters, corpus, tmp_path
):
    """Resume (a crashed run's missing part redone, the others reused), then a reindex into Lance in chunks (a new
    version when a shard arrives), for an adapter as for any model (tests/jobs/ for the base's): every row once,
    each the adapter's own vector (PEFT's), none its base's."""
    import shutil
    from collections import Counter

    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml

    from tests.support.cli import invoke_shoal, shoal_options
    from tests.support.files import read_output

    lance = pytest.importorskip("lance")
    _, client = cluster
    source, bodies = corpus
    folder = tmp_path / "corpus"
    shutil.copytree(source, folder)  # the module's corpus stays as it is: a shard is added below
    name, adapter = "embedder+lora-1", adapters["embedder"][1]
    present = [key for key, body in bodies.items() if body is not None]
    expected = dict(zip(present, peft_embeddings(bases["embedder"], adapter, [bodies[key] for key in present])))
    out = tmp_path / "out"
    embed = [
        "embed", str(folder), str(out), "--model", name, "--text-column", "body", "--id-column", "key",
        *shoal_options(catalog_path, client.scheduler.address),
    ]  # fmt: skip
    assert invoke_shoal(*embed).returncode == 0
    items = json.loads((out / "_manifest.json").read_text())["work"]["items"]
    (out / "_manifest.json").unlink()  # a run that crashed: no manifest, a part missing
    sorted(out.glob("part-*"))[1].unlink()
    resumed = invoke_shoal(*embed)
    assert resumed.returncode == 0, resumed.stderr
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["work"] == {"items": items, "reused": items - 1, "run": 1, "removed": 0}
    assert manifest["model"]["name"] == name
    table = read_output(out)
    keys = table.column("key").to_pylist()
    assert sorted(keys) == sorted(bodies)
    got = dict(zip(keys, table.column("embedding").to_pylist()))
    np.testing.assert_allclose([got[key] for key in present], [expected[key] for key in present], atol=1e-5)

    dataset = tmp_path / "docs.lance"
    job = {
        "name": "docs", "input": str(folder), "output": str(dataset), "model": name, "catalog": str(catalog_path),
        "scheduler": client.scheduler.address, "lock": {"settle_seconds": 0.1}, "format": "lance",
        "columns": {"text": "body", "id": "key"}, "chunk": {"tokens": 32, "overlap": 4},
    }  # fmt: skip
    (tmp_path / "docs.yaml").write_text(yaml.safe_dump(job))
    first = invoke_shoal("reindex", str(tmp_path / "docs.yaml"))
    assert first.returncode == 0, first.stderr
    more = {90_001: "A shard that arrived later.", 90_004: "Its second text, also short."}
    pq.write_table(pa.table({"key": list(more), "body": list(more.values())}), folder / "shard-3.parquet")
    again = invoke_shoal("reindex", str(tmp_path / "docs.yaml"))
    assert again.returncode == 0, again.stderr
    assert lance.dataset(str(dataset)).version == 2  # the new shard: a version of its own
    rows = lance.dataset(str(dataset)).to_table().to_pylist()
    chunks = Counter((row["key"], row["chunk"]) for row in rows)
    assert max(chunks.values()) == 1 and {key for key, _ in chunks} >= set(present) | set(more)
    windows = Counter(row["key"] for row in rows)
    assert max(windows.values()) > 1  # the long texts were cut into windows
    expected |= dict(zip(more, peft_embeddings(bases["embedder"], adapter, list(more.values()))))
    whole = [row for row in rows if windows[row["key"]] == 1 and row["key"] in expected]  # one window: the text
    assert len(whole) > len(more)
    np.testing.assert_allclose([row["embedding"] for row in whole], [expected[row["key"]] for row in whole], atol=1e-5)


def test_the_quality_gate_holds_an_adapter_to_its_own_fp32_output(catalog_path, bases, adapters, tmp_path):
    """`shoal check-precision` of an adapter: torch candidates only (its layers live in the base's torch model),
    each against the adapter's own fp32 output (PEFT's, not the base's); with --profile nothing is written under
    an adapter that computes in its base's forward passes (runtimes.BASE decides it)."""
    from shoal.configs import RuntimeChoice, load_profile
    from shoal.pipeline.tuning.quality_gate import PrecisionGate
    from tests.support.cli import invoke_shoal

    spec = load_catalog(catalog_path).get("embedder+lora-1")
    gate = PrecisionGate(spec, PLAN, TEXTS, judged_set=None)
    own = peft_embeddings(bases["embedder"], adapters["embedder"][1], TEXTS)
    np.testing.assert_allclose(gate.reference_outputs, own, atol=1e-5)
    assert np.abs(own - peft_embeddings(bases["embedder"], None, TEXTS)).max() > 1e-3  # the base's would differ
    verdict = gate.check(RuntimeChoice(runtime="torch", dtype="bfloat16"))
    assert verdict.model == "embedder+lora-1" and set(verdict.figures) == {"cosine_mean", "cosine_min"}
    with pytest.raises(ValueError, match="embedder\\+lora-1' is a LoRA adapter: it runs on its base's torch model"):
        gate.check(RuntimeChoice(runtime="onnx", dtype="float32"))

    texts = tmp_path / "sample.txt"
    texts.write_text("\n".join(TEXTS))
    profile = tmp_path / "gated.yaml"
    profile.write_text("name: gated\ndevice: cpu\nthreads_per_worker: 1\n")
    every = invoke_shoal("check-precision", "--model", "embedder+lora-1", "--texts", str(texts), "--catalog",
                         str(catalog_path))  # fmt: skip
    assert every.returncode == 0, every.stderr
    assert "onnx" not in every.stdout and every.stdout.count("│ torch") == 2  # torch's dtypes only (fp32, bf16)
    single = invoke_shoal("check-precision", "--model", "embedder+lora-1", "--texts", str(texts), "--dtype",
                          "bfloat16", "--profile", str(profile), "--catalog", str(catalog_path))  # fmt: skip
    assert "not written: embedder+lora-1 computes in embedder's forward passes" in single.stderr
    assert load_profile(str(profile)).runtimes == {}


def test_an_adapter_that_does_not_fit_or_lacks_its_base_is_refused_before_any_work(
    catalog_path, bases, adapters, tmp_path
):
    from tests.support.cli import invoke_shoal, shoal_options

    source = tmp_path / "in"
    source.mkdir()
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": ["a"], "text": ["hello"]}), source / "part.parquet")
    # A reranker's adapter over the embedder: its modules sit under `bert.` in a classification model.
    crossed = invoke_shoal(
        "embed", str(source), str(tmp_path / "out"), "--model", f"embedder+{adapters['reranker'][0]}",
        *shoal_options(catalog_path),
    )  # fmt: skip
    assert crossed.returncode == 2, crossed.stderr
    assert f"adapter {adapters['reranker'][0]} does not fit base model 'embedder'" in crossed.stderr
    assert str(bases["reranker"]) in crossed.stderr  # the base it names
    orphan = tmp_path / "orphan"
    orphan.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (orphan / name).write_bytes((adapters["embedder"][0] / name).read_bytes())
    config = json.loads((orphan / "adapter_config.json").read_text())
    (orphan / "adapter_config.json").write_text(
        json.dumps({**config, "base_model_name_or_path": str(tmp_path / "gone")})
    )
    missing = invoke_shoal(
        "embed", str(source), str(tmp_path / "out"), "--model", str(orphan), *shoal_options(catalog_path)
    )
    assert missing.returncode == 2 and f"adapter {orphan} names base model '{tmp_path / 'gone'}'" in missing.stderr
    assert not (tmp_path / "out").exists()  # before any work: nothing planned, nothing written


@pytest.fixture(scope="module")
def gateway(cluster, catalog_path):
    """The gateway on the session's cluster, serving every base and adapter of the catalog: its URL. A request's
    deadline is minutes: the first ones wait for four bases to load on a shared 2-core machine."""
    from shoal.pipeline.cluster import pull_queue

    _, client = cluster
    models = {name: spec.model_dump() for name, spec in load_catalog(catalog_path).models.items()}
    reply = client.sync(
        pull_queue(client).gateway_start,
        settings={"port": 0, "request_timeout_seconds": 300},
        models=models,
        replace=True,
    )
    yield reply["url"]
    client.sync(pull_queue(client).gateway_stop)


def test_online_requests_for_many_adapters_at_once_equal_peft(gateway, bases, adapters):
    from concurrent.futures import ThreadPoolExecutor

    from shoal.pipeline.client import OnlineClient

    names = [None, *range(ADAPTERS)]  # the base and each adapter, every one asked twice at once
    query, documents = TEXTS[0], TEXTS[1:]

    def ask(which: int | None) -> tuple[np.ndarray, np.ndarray, list, list]:
        suffix = "" if which is None else f"+lora-{which}"
        with OnlineClient(gateway, timeout=120) as online:
            return (
                online.encode(f"embedder{suffix}", TEXTS),
                online.rerank(f"reranker{suffix}", query, documents),
                online.classify(f"classifier{suffix}", TEXTS),
                online.extract(f"token_classifier{suffix}", TEXTS),
            )

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, [*names, *names]))
    for which, (vectors, scores, labels, entities) in zip([*names, *names], answers):
        folder = {kind: None if which is None else adapters[kind][which] for kind in bases}
        np.testing.assert_allclose(vectors, peft_embeddings(bases["embedder"], folder["embedder"], TEXTS), atol=1e-5)
        pairs = [(query, document) for document in documents]
        np.testing.assert_allclose(scores, peft_scores(bases["reranker"], folder["reranker"], pairs), atol=1e-5)
        logits = np.array(peft_logits(bases["classifier"], folder["classifier"], TEXTS, "classifier"))
        probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        for row, answer in zip(probabilities, labels):
            assert max(abs(entry["score"] - row[SENTIMENT.index(entry["label"])]) for entry in answer) <= 1e-5
        expected = peft_entities(bases["token_classifier"], folder["token_classifier"], TEXTS)
        assert [[(e["label"], e["start"], e["end"]) for e in row] for row in entities] == expected


def test_served_adapters_are_listed_under_their_base_and_an_unknown_one_is_a_404_naming_them(gateway):
    from tests.support.gateway import post

    with urllib.request.urlopen(gateway + "/v1/models", timeout=30) as response:
        served = {entry["id"]: entry for entry in json.loads(response.read())["data"]}
    assert served["embedder+lora-1"]["parent"] == "embedder" and "parent" not in served["embedder"]
    assert (
        served["embedder+lora-1"]["kind"] == "embedder"
        and served["embedder+lora-1"]["dim"] == served["embedder"]["dim"]
    )
    status, reply = post(gateway, "/v1/encode/embedder+lora-9", {"texts": ["hello"]}, "application/json")
    assert status == 404
    assert "unknown adapter 'lora-9' of model 'embedder'" in reply["error"]["message"]
    assert "embedder+lora-0, embedder+lora-1, embedder+lora-2" in reply["error"]["message"]
    status, _ = post(gateway, "/v1/encode/embedder+lora-0", {"texts": ["still up"]}, "application/json")
    assert status == 200
    with urllib.request.urlopen(gateway + "/metrics", timeout=30) as response:
        metrics = response.read().decode()
    assert 'shoal_online_requests_total{model="embedder+lora-0",status="200"}' in metrics  # per adapter


def test_adapters_removed_and_added_again_leave_the_others_and_the_base_as_peft_has_them(bases, adapters):
    """Removal as the pool evicts: the first adapter (PEFT's active one), one placed directly, then that one back."""
    from shoal.configs import AdapterSpec
    from shoal.workers.runtimes import load_runtime
    from shoal.workers.runtimes.lora import LoraLayers, read_adapter

    catalog = load_catalog_of(bases["embedder"])
    runtime: Any = load_runtime(catalog, PLAN)
    runtime.lora = layers = LoraLayers.of(runtime.model)
    specs = [
        AdapterSpec(base="embedder", name=f"lora-{i}", source=str(folder))
        for i, folder in enumerate(adapters["embedder"][:ADAPTERS])
    ]
    for spec in specs:
        layers.add(read_adapter(spec, "cpu"))
    layers.remove("lora-0")
    layers.remove("lora-1")
    layers.add(read_adapter(specs[1], "cpu"))
    assert sorted(layers.names()) == ["lora-1", "lora-2"]
    per_input = ["lora-2", None, "lora-1"] * 2
    vectors, _ = runtime.embed(TEXTS, adapters=per_input)
    for row, adapter in enumerate(per_input):
        folder = adapters["embedder"][int(adapter[-1])] if adapter else None
        np.testing.assert_allclose(vectors[row], peft_embeddings(bases["embedder"], folder, [TEXTS[row]])[0], atol=1e-5)
    for name in ("lora-1", "lora-2"):
        layers.remove(name)
    assert layers.peft is None  # the last out unloads PEFT's layers: the base model as it was loaded
    plain, _ = runtime.embed(TEXTS)
    np.testing.assert_allclose(plain, peft_embeddings(bases["embedder"], None, TEXTS), atol=1e-5)


def load_catalog_of(folder: Path) -> ModelSpec:
    from shoal.configs.model_resolution import resolve_unlisted

    return resolve_unlisted(str(folder), [])


def test_a_merged_adapter_is_a_model_of_its_own_equal_to_peft(catalog_path, bases, adapters):
    """A profile's `merged_adapters`: the adapter merged into a copy of its base, no LoRA layers left."""
    from shoal.configs import Profile
    from shoal.workers.runtimes import load_runtime

    spec = Profile(name="p", merged_adapters=["reranker+lora-1"]).tuned(
        load_catalog(catalog_path).get("reranker+lora-1")
    )
    runtime: Any = load_runtime(spec, PLAN)
    assert runtime.lora is None and runtime.spec.name == "reranker+lora-1"
    pairs = [(TEXTS[i], TEXTS[(i + 2) % len(TEXTS)]) for i in range(len(TEXTS))]
    scores, _ = runtime.score([q for q, _ in pairs], [p for _, p in pairs])
    np.testing.assert_allclose(scores, peft_scores(bases["reranker"], adapters["reranker"][1], pairs), atol=1e-5)


def test_one_online_call_answers_requests_of_several_adapters_and_the_base_as_peft_does(catalog_path, bases, adapters):
    """What a worker's online group hands each kind's operation: the base's runtime, each payload naming its
    adapter (workers/batching/online_groups.through), one call for all of them."""
    from shoal.workers.operations import online_operation

    kinds = ["embedder", "reranker", "classifier", "token_classifier"]
    runtimes, pool, device = _attached([f"{kind}+lora-{i}" for kind in kinds for i in range(ADAPTERS)], catalog_path)
    base = {kind: runtimes[k * ADAPTERS].base for k, kind in enumerate(kinds)}
    order = [None, *range(ADAPTERS)]
    named = [{} if i is None else {"adapter": f"lora-{i}"} for i in order]
    folder = {kind: [None if i is None else adapters[kind][i] for i in order] for kind in kinds}

    def call(op: str, kind: str, payloads: list[dict]) -> list[dict]:
        return device.run(online_operation(op), base[kind], payloads).result()

    answers = call("embed", "embedder", [{"texts": TEXTS, **n} for n in named])
    for answer, f in zip(answers, folder["embedder"]):
        vectors = np.frombuffer(answer["embeddings"], "<f4").reshape(answer["shape"])
        np.testing.assert_allclose(vectors, peft_embeddings(bases["embedder"], f, TEXTS), atol=1e-5)
    answers = call("rerank", "reranker", [{"query": TEXTS[0], "documents": TEXTS[1:], **n} for n in named])
    for answer, f in zip(answers, folder["reranker"]):
        expected = peft_scores(bases["reranker"], f, [(TEXTS[0], d) for d in TEXTS[1:]])
        np.testing.assert_allclose(answer["scores"], expected, atol=1e-5)
    answers = call("classify", "classifier", [{"texts": TEXTS, **n} for n in named])
    for answer, f in zip(answers, folder["classifier"]):
        logits = np.array(peft_logits(bases["classifier"], f, TEXTS, "classifier"))
        probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        for row, labels in zip(probabilities, answer["outputs"]):
            assert max(abs(e["score"] - row[SENTIMENT.index(e["label"])]) for e in labels) <= 1e-5
    answers = call("extract", "token_classifier", [{"texts": TEXTS, **n} for n in named])
    for answer, f in zip(answers, folder["token_classifier"]):
        expected = peft_entities(bases["token_classifier"], f, TEXTS)
        assert [[(e["label"], e["start"], e["end"]) for e in row] for row in answer["outputs"]] == expected
    device.shutdown()


@pytest.mark.parametrize("kind", ["reranker", "classifier", "token_classifier"])
def test_a_job_of_several_adapters_of_each_kind_equals_peft(cluster, catalog_path, bases, adapters, tmp_path, kind):
    """`shoal rerank`, `classify`, `extract` with --model A,B over one base's adapters: OUTPUT/<model>/ each."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shoal.pipeline.jobs.engine import output_folder
    from tests.support.cli import invoke_shoal, shoal_options
    from tests.support.files import read_output

    _, client = cluster
    rows = {f"r{i}": (TEXTS[i % len(TEXTS)], TEXTS[(i + 1) % len(TEXTS)]) for i in range(18)}
    source = tmp_path / "in"
    source.mkdir()
    table = {"key": list(rows), "query": [q for q, _ in rows.values()], "passage": [p for _, p in rows.values()]}
    pq.write_table(pa.table(table), source / "part.parquet", row_group_size=7)
    command = {"reranker": "rerank", "classifier": "classify", "token_classifier": "extract"}[kind]
    columns = ["--text-column", "query"] if kind != "reranker" else ["--query-column", "query"]
    names = [f"{kind}+lora-0", f"{kind}+lora-2"]
    result = invoke_shoal(
        command, str(source), str(tmp_path / "out"), "--model", ",".join(names), "--id-column", "key", *columns,
        *shoal_options(catalog_path, client.scheduler.address),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    for name, folder in zip(names, [adapters[kind][0], adapters[kind][2]]):
        out = read_output(tmp_path / "out" / output_folder(name))
        keys = out.column("key").to_pylist()
        assert sorted(keys) == sorted(rows)  # every id once per adapter
        if kind == "reranker":
            got = dict(zip(keys, out.column("score").to_pylist()))
            expected = peft_scores(bases[kind], folder, list(rows.values()))
            np.testing.assert_allclose([got[k] for k in rows], expected, atol=1e-5)
        elif kind == "classifier":
            got = dict(zip(keys, out.column("labels").to_pylist()))
            logits = np.array(peft_logits(bases[kind], folder, [q for q, _ in rows.values()], kind))
            probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
            for key, row in zip(rows, probabilities):
                assert max(abs(e["score"] - row[SENTIMENT.index(e["label"])]) for e in got[key]) <= 1e-5
        else:
            got = dict(zip(keys, out.column("entities").to_pylist()))
            expected = peft_entities(bases[kind], folder, [q for q, _ in rows.values()])
            assert [[(e["label"], e["start"], e["end"]) for e in got[k]] for k in rows] == expected
