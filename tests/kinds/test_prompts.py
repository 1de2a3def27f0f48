"""Named prompts (configs/prompts.py): read from the model's files, applied alike by every runtime, in batch
jobs and online requests, and per role by `shoal run` and `shoal eval`.

The reference is sentence-transformers itself: `SentenceTransformer.encode(texts, prompt_name=...)` on a tiny
model whose config_sentence_transformers.json defines E5-like `query` and `document` prompts.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from rich.console import Console

from shoal.configs import ConfigError, GatewaySettings, ModelSpec, load_catalog
from shoal.configs.prompts import ModelPrompts, PromptError, model_prompts
from shoal.pipeline.jobs.embed import EmbedRequest, check_embed_options, embed_job, with_prompt
from shoal.pipeline.jobs.resume import job_params
from shoal.pipeline.model_listing import render_models
from shoal.pipeline.retrieval.run import embed_requests
from shoal.pipeline.retrieval.spec import JobSpec
from shoal.scheduler_plugins.gateway import api_formats
from shoal.scheduler_plugins.gateway.wire import RequestError
from shoal.workers.data.chunking import ChunkSettings
from shoal.workers.operations import embed_operation
from shoal.workers.operations.embed_operation import EmbedInput
from shoal.workers.runtimes.sim_runtime import SimulatedRuntime
from tests.support.cli import invoke_shoal, shoal_options
from tests.support.files import read_output, write_profile
from tests.support.models import TINY_DIM, TINY_MAX_SEQ, TINY_PROMPTS, build_tiny_embedder

# Short, non-ASCII, and one past the window once the prompt is in: the prompt's tokens cut the text, not it.
TEXTS = [
    "How do I read a Parquet file in chunks?",
    "a",
    "Café naïve résumé — déjà vu 東京",
    " ".join(["Long passages are cut to the model's window, prompt included."] * 20),
]
SIM = {"kind": "sim", "dim": 8, "max_seq_length": 64, "memory_bytes": 1000, "prompts": TINY_PROMPTS}
LIMITS = GatewaySettings(max_inputs=8, max_input_chars=2000)


def sim_runtime(**fields) -> SimulatedRuntime:
    return SimulatedRuntime(ModelSpec(name="sim-p", **{**SIM, **fields}))


def vectors_of(result: dict) -> np.ndarray:
    assert "error" not in result, result
    return np.frombuffer(result["embeddings"], "<f4").reshape(result["shape"])


# -- unit: choosing the text --------------------------------------------------------------


def test_the_prompt_text_is_chosen_as_encode_chooses_it():
    prompts = ModelPrompts("m", {**TINY_PROMPTS, "sts": "sts: "}, default_name="sts")
    assert prompts.text() == "sts: "  # neither given: the default
    assert prompts.text("query") == "query: " and prompts.text(prompt="q> ") == "q> " and prompts.text(prompt="") == ""
    assert ModelPrompts("plain").text("query") == ""  # every embedder has query and document, empty unless set
    with pytest.raises(
        PromptError, match=r"no prompt named 'qeury'; it has: document \('passage: '\), query \('query: '\), sts"
    ):
        prompts.text("qeury")
    with pytest.raises(PromptError, match="not both"):
        prompts.text("query", "q> ")
    with pytest.raises(ConfigError, match="default_prompt_name 'nope' is not one of its prompts"):
        ModelPrompts("m", TINY_PROMPTS, default_name="nope")
    assert prompts.for_role("query") == "query" and prompts.for_role("document") == "document"
    assert ModelPrompts("e5", {"query": "query: ", "passage": "passage: "}).for_role("document") == "passage"
    assert ModelPrompts("plain", {"query": ""}).for_role("query") is None  # empty: the default applies


def test_prompts_come_from_the_model_files_and_a_catalog_entry_lays_its_own_over_them(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    config = {"model_type": "SentenceTransformer", "prompts": TINY_PROMPTS, "default_prompt_name": None}
    (folder / "config_sentence_transformers.json").write_text(json.dumps(config))
    entry = {"kind": "embedder", "source": str(folder), "dim": 4, "max_seq_length": 16}
    catalog = tmp_path / "catalog.yaml"
    overridden = {**entry, "prompts": {"query": "Represent this question: "}, "default_prompt_name": "document"}
    catalog.write_text(yaml.safe_dump({"models": {"plain": entry, "overridden": overridden}}))
    models = load_catalog(catalog)
    assert model_prompts(models.get("plain")) == ModelPrompts("plain", TINY_PROMPTS)
    laid_over = model_prompts(models.get("overridden"))
    assert laid_over.named == {"query": "Represent this question: ", "document": "passage: "}
    assert laid_over.text() == "passage: "
    (folder / "config_sentence_transformers.json").write_text(json.dumps({"prompts": ["query: "]}))
    with pytest.raises(ConfigError, match=r"config_sentence_transformers.json: prompts must map names to texts"):
        model_prompts(models.get("plain"))


# -- unit: online requests -----------------------------------------------------------------


def test_online_requests_with_different_prompts_in_one_group_each_get_their_own():
    runtime = sim_runtime()
    payloads = [
        {"texts": ["a", "b"]},
        {"texts": ["a"], "prompt_name": "query"},
        {"texts": ["b", "a"], "prompt": "query: "},
        {"texts": ["a"], "prompt_name": "document"},
        {"texts": ["a"], "prompt_name": "qeury"},
    ]
    plain, query, literal, document, unknown = embed_operation.online(runtime, payloads)
    assert np.array_equal(vectors_of(plain), runtime.embed(["a", "b"], prompt="")[0])
    assert np.array_equal(vectors_of(query), runtime.embed(["query: a"], prompt="")[0])
    assert np.array_equal(vectors_of(literal)[1], vectors_of(query)[0])
    assert np.array_equal(vectors_of(document), runtime.embed(["passage: a"], prompt="")[0])
    assert not np.array_equal(vectors_of(query), vectors_of(plain)[:1])
    assert unknown["status"] == 400 and "no prompt named 'qeury'" in unknown["error"]
    assert "it has: document ('passage: '), query ('query: ')" in unknown["error"]
    # tokens count the prompt, as the model reads it: "query: a" is 8 characters, 2 + 8 // 4 tokens
    assert query["tokens"] == 4 and plain["tokens"] == 2 * 2


def test_a_prompt_counts_towards_truncation_and_a_default_prompt_applies_when_none_is_asked():
    runtime = sim_runtime(max_seq_length=4, default_prompt_name="query")
    fits = "x" * 8  # 2 + 8 // 4 = 4 tokens alone; 2 + 15 // 4 = 5 with "query: "
    assert runtime.token_lengths([fits], prompt="")[1] == 0 and runtime.token_lengths([fits])[1] == 1
    refused, plain = embed_operation.online(
        runtime, [{"texts": [fits], "truncate": False}, {"texts": [fits], "truncate": False, "prompt": ""}]
    )
    assert refused["status"] == 422 and "truncate is off" in refused["error"]
    assert np.array_equal(vectors_of(plain), runtime.embed([fits], prompt="")[0])


def test_the_gateway_passes_a_prompt_name_or_text_to_the_worker_and_refuses_both():
    native = api_formats.encode_call("m", {"texts": ["a"], "prompt_name": "query"}, LIMITS)
    assert native.payload() == {"texts": ["a"], "truncate": True, "dtype": "float32", "prompt_name": "query"}
    assert api_formats.encode_call("m", {"texts": ["a"], "prompt": ""}, LIMITS).payload()["prompt"] == ""
    assert "prompt" not in api_formats.encode_call("m", {"texts": ["a"]}, LIMITS).payload()
    body = api_formats.openai_request({"model": "m", "input": "a", "prompt_name": "document"}, LIMITS)
    openai = api_formats.openai_call(body, body.texts(), LIMITS)
    assert openai.payload()["prompt_name"] == "document"
    with pytest.raises(RequestError, match="give prompt_name or prompt, not both") as both:
        api_formats.encode_call("m", {"texts": ["a"], "prompt_name": "query", "prompt": "q"}, LIMITS)
    assert both.value.status == 400
    with pytest.raises(RequestError, match="prompt has 2001 characters") as long:
        api_formats.encode_call("m", {"texts": ["a"], "prompt": "p" * 2001}, LIMITS)
    assert long.value.status == 422
    with pytest.raises(RequestError, match="prompt_name: Input should be a valid string"):
        api_formats.encode_call("m", {"texts": ["a"], "prompt_name": 3}, LIMITS)


# -- unit: batch jobs and the retrieval pipeline ----------------------------------------------


def test_a_batch_prompt_is_its_text_in_the_options_digest_so_a_change_re_embeds():
    spec = ModelSpec(name="sim-p", **SIM)
    request = EmbedRequest(input="in/", output="out/", model="sim-p")
    payloads = {
        name: embed_job(with_prompt(EmbedRequest("in/", "out/", "sim-p", prompt_name=name), spec)).payload
        for name in ("query", "document")
    }
    assert payloads["query"]["prompt"] == "query: " and payloads["document"]["prompt"] == "passage: "
    assert "prompt" not in embed_job(request).payload  # no prompt asked: outputs from before prompts stay current
    digests = {job_params("embed", p) for p in [*payloads.values(), embed_job(request).payload]}
    assert len(digests) == 3
    literal = embed_job(EmbedRequest("in/", "out/", "sim-p", prompt="query: ")).payload
    assert job_params("embed", literal) == job_params("embed", payloads["query"])  # the text counts, not the name
    with pytest.raises(PromptError, match="no prompt named 'qeury'"):
        check_embed_options(EmbedRequest("in/", "out/", "sim-p", prompt_name="qeury"), spec)


def test_run_embeds_queries_and_documents_with_the_model_prompts_for_their_role_unless_overridden():
    job = {"output": "out/", "corpus": {"input": "c/"}, "queries": {"input": "q/"}, "embed": {"model": "m"}}
    requests = embed_requests(JobSpec(**job), ModelPrompts("m", TINY_PROMPTS))
    assert requests["query-embeddings"].prompt == "query: " and requests["corpus-embeddings"].prompt == "passage: "
    plain = embed_requests(JobSpec(**job), ModelPrompts("m"))
    assert plain["query-embeddings"].prompt is None and plain["corpus-embeddings"].prompt is None  # the default
    job["queries"] = {"input": "q/", "prompt": ""}
    job["corpus"] = {"input": "c/", "prompt_name": "query"}
    overridden = embed_requests(JobSpec(**job), ModelPrompts("m", TINY_PROMPTS))
    assert overridden["query-embeddings"].prompt == "" and overridden["corpus-embeddings"].prompt == "query: "
    job["queries"] = {"input": "q/", "prompt": "", "prompt_name": "query"}
    with pytest.raises(ValueError, match="give prompt_name or prompt, not both"):
        JobSpec(**job)


# -- integration: the tiny model on every runtime, batch and online ------------------------


@pytest.fixture(scope="module")
def prompted(tmp_path_factory):
    """A tiny model with query and document prompts, in a catalog on torch (`tiny-p`), ONNX (`tiny-p-onnx`) and
    the simulated runtime (`sim-p`), and an export cache of the module's own."""
    root = tmp_path_factory.mktemp("prompted")
    model = build_tiny_embedder(root / "build", prompts=TINY_PROMPTS)
    entry = {
        "kind": "embedder",
        "source": str(model),
        "dim": TINY_DIM,
        "max_seq_length": TINY_MAX_SEQ,
        "normalize": True,
        "memory_bytes": 10_000_000,
    }
    onnx = {**entry, "runtimes": {"cpu": {"runtime": "onnx", "dtype": "float32"}}}
    catalog = root / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"models": {"tiny-p": entry, "tiny-p-onnx": onnx, "sim-p": SIM}}))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SHOAL_CACHE_DIR", str(root / "shoal-cache"))  # workers started here inherit it
        yield model, catalog


def expected_vectors(model: Path, texts: list[str], prompt_name: str | None) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model), device="cpu").encode(texts, prompt_name=prompt_name)


@pytest.mark.integration
def test_models_lists_each_model_s_prompts_from_its_files_by_catalog_name_or_path(prompted):
    model, catalog = prompted
    listed = invoke_shoal("models", "--catalog", str(catalog), "--catalog-only", "--json")
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert rows["tiny-p"]["prompts"] == rows["sim-p"]["prompts"] == TINY_PROMPTS
    assert rows["minilm"]["prompts"] == {} and rows["tiny-p"]["default_prompt_name"] is None
    shown = Console(file=io.StringIO(), width=300)
    render_models([{**rows["tiny-p"], "default_prompt_name": "query"}], shown)
    assert "document, query (default)" in shown.file.getvalue()
    assert model_prompts(load_catalog(catalog).get(str(model))) == ModelPrompts(str(model), TINY_PROMPTS)


@pytest.mark.integration
@pytest.mark.parametrize("name", ["tiny-p", "tiny-p-onnx"])
def test_every_runtime_gives_encode_vectors_and_token_counts_with_each_prompt(prompted, name):
    from sentence_transformers import SentenceTransformer

    from shoal.workers.devices import DevicePlan
    from shoal.workers.runtimes import load_runtime

    model, catalog = prompted
    runtime = load_runtime(load_catalog(catalog).get(name), DevicePlan("cpu", "cpu", "float32", 10**9, 1))
    tokenizer = SentenceTransformer(str(model), device="cpu").tokenizer
    try:
        for prompt_name, prompt in (("query", "query: "), ("document", "passage: "), (None, "")):
            expected = expected_vectors(model, TEXTS, prompt_name)
            direct, truncated = runtime.embed(TEXTS, prompt=prompt)
            np.testing.assert_allclose(direct, expected, atol=1e-5)
            (online,) = embed_operation.online(runtime, [{"texts": TEXTS, "prompt_name": prompt_name}])
            np.testing.assert_allclose(vectors_of(online), expected, atol=1e-5)
            raw = [len(ids) for ids in tokenizer([prompt + t for t in TEXTS])["input_ids"]]
            lengths, counted = runtime.token_lengths(TEXTS, prompt)
            assert list(lengths) == [min(n, TINY_MAX_SEQ) for n in raw] and counted == truncated == 1
            assert online["tokens"] == int(lengths.sum())
        # Chunked to the model's whole window, windows leave room for the prompt: none is cut.
        table = pa.table({"text": TEXTS})
        chunked = embed_operation.compute(
            runtime, EmbedInput(table, TEXTS, chunk=ChunkSettings(tokens=TINY_MAX_SEQ), prompt="passage: ")
        )
        assert chunked.windows is not None
        windows = chunked.windows.texts
        assert chunked.truncated == 0 and len(windows) > len(TEXTS)  # the long text is windows now
        assert max(len(ids) for ids in tokenizer(["passage: " + w for w in windows])["input_ids"]) <= TINY_MAX_SEQ
        np.testing.assert_allclose(chunked.vectors, expected_vectors(model, windows, "document"), atol=1e-5)
    finally:
        runtime.close()


@pytest.fixture(scope="module")
def prompt_cluster(prompted, tmp_path_factory):
    from distributed import Client

    from shoal.configs import load_profile
    from shoal.pipeline.cluster import start_local_cluster

    _, catalog = prompted
    profile = load_profile(str(write_profile(tmp_path_factory.mktemp("profile"), name="prompts", workers=1)))
    with start_local_cluster(profile, str(catalog)) as local, Client(local) as client:
        client.wait_for_workers(1)
        yield client, shoal_options(catalog, client.scheduler.address, profile.path)


def write_texts(path: Path, texts: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": [f"t{i}" for i in range(len(texts))], "text": texts}), path)
    return path


def embedded(output: Path) -> np.ndarray:
    return np.stack(read_output(output).sort_by("id").column("embedding").to_numpy(zero_copy_only=False))


@pytest.mark.integration
def test_batch_jobs_equal_encode_with_the_prompt_asked_on_every_runtime_and_a_new_prompt_re_embeds(
    prompted, prompt_cluster, tmp_path
):
    model, _ = prompted
    source = write_texts(tmp_path / "in" / "texts.parquet", TEXTS)
    _, on_cluster = prompt_cluster
    for name in ("tiny-p", "tiny-p-onnx"):
        output = tmp_path / name
        for prompt_name in ("query", "document"):
            done = invoke_shoal(
                "embed", str(source), str(output), "--model", name, "--prompt-name", prompt_name, *on_cluster
            )
            assert done.returncode == 0, done.stderr
            np.testing.assert_allclose(embedded(output), expected_vectors(model, TEXTS, prompt_name), atol=1e-5)
            assert json.loads((output / "_manifest.json").read_text())["work"]["run"] == 1  # re-embedded
        again = invoke_shoal("embed", str(source), str(output), "--model", name, "--prompt", "passage: ", *on_cluster)
        assert json.loads((output / "_manifest.json").read_text())["work"]["reused"] == 1, again.stderr
    sim_out = tmp_path / "sim"
    assert (
        invoke_shoal(
            "embed", str(source), str(sim_out), "--model", "sim-p", "--prompt-name", "query", *on_cluster
        ).returncode
        == 0
    )
    sim = sim_runtime()
    np.testing.assert_array_equal(embedded(sim_out), sim.embed(["query: " + t for t in TEXTS], prompt="")[0])
    unknown = invoke_shoal(
        "embed", str(source), str(tmp_path / "x"), "--model", "tiny-p", "--prompt-name", "qeury", *on_cluster
    )
    assert (
        unknown.returncode == 2
        and "no prompt named 'qeury'; it has: document ('passage: '), query ('query: ')" in unknown.stderr
    )


@pytest.mark.integration
def test_online_requests_equal_encode_with_their_prompt_on_every_runtime(prompted, prompt_cluster):
    import http.client
    from urllib.parse import urlsplit

    from shoal.pipeline.client import OnlineClient, OnlineError
    from shoal.pipeline.cluster import pull_queue

    model, catalog = prompted
    models = {n: s.model_dump() for n, s in load_catalog(catalog).models.items()}
    settings = {"port": 0, "request_timeout_seconds": 120}
    client, _ = prompt_cluster
    reply = client.sync(pull_queue(client).gateway_start, settings=settings, models=models)
    url = reply["url"]
    expected = {name: expected_vectors(model, TEXTS, name) for name in ("query", "document")}
    with OnlineClient(url, timeout=120) as online:
        for name in ("tiny-p", "tiny-p-onnx"):
            for prompt_name in ("query", "document"):
                vectors = online.encode(name, TEXTS, prompt_name=prompt_name)
                np.testing.assert_allclose(vectors, expected[prompt_name], atol=1e-5)
            np.testing.assert_allclose(online.encode(name, TEXTS, prompt="query: "), expected["query"], atol=1e-5)
        sim = sim_runtime()
        queried = online.encode("sim-p", TEXTS, prompt_name="query")
        np.testing.assert_array_equal(queried, sim.embed(["query: " + t for t in TEXTS], prompt="")[0])
        with pytest.raises(OnlineError, match="no prompt named 'qeury'; it has: document") as unknown:
            online.encode("tiny-p", TEXTS, prompt_name="qeury")
        assert unknown.value.status == 400
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    body = {"model": "tiny-p-onnx", "input": TEXTS, "prompt_name": "document"}
    conn.request("POST", "/v1/embeddings", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    data = json.loads(response.read())
    conn.close()
    assert response.status == 200, data
    vectors = np.array([row["embedding"] for row in data["data"]], dtype=np.float32)
    np.testing.assert_allclose(vectors, expected["document"], atol=1e-5)


@pytest.mark.integration
def test_eval_embeds_queries_with_the_query_prompt_and_the_corpus_with_the_document_prompt(
    prompted, prompt_cluster, tmp_path
):
    model, _ = prompted
    data = tmp_path / "set"
    data.mkdir()
    corpus = {f"d{i}": text for i, text in enumerate(TEXTS)}
    queries = {"q0": "how to read parquet", "q1": "unicode text"}
    (data / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, "text": t}) + "\n" for d, t in corpus.items()))
    (data / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items()))
    qrels = [("q0", "d0"), ("q1", "d2")]
    (data / "qrels.jsonl").write_text(
        "".join(json.dumps({"query_id": q, "corpus_id": d, "score": 1}) + "\n" for q, d in qrels)
    )
    _, on_cluster = prompt_cluster
    output = tmp_path / "eval"
    result = invoke_shoal("eval", str(data), "--model", "tiny-p", "--top-k", "3", "--output", str(output), *on_cluster)
    assert result.returncode == 0, result.stderr
    report = json.loads((output / "metrics.json").read_text())
    assert report["prompts"] == {"queries": "query: ", "corpus": "passage: "}
    np.testing.assert_allclose(
        embedded(output / "query-embeddings"), expected_vectors(model, list(queries.values()), "query"), atol=1e-5
    )
    np.testing.assert_allclose(
        embedded(output / "corpus-embeddings"), expected_vectors(model, list(corpus.values()), "document"), atol=1e-5
    )
    plain = invoke_shoal(
        "eval",
        str(data),
        "--model",
        "tiny-p",
        "--top-k",
        "3",
        "--output",
        str(output),
        "--query-prompt",
        "",
        *on_cluster,
    )
    assert plain.returncode == 0, plain.stderr
    np.testing.assert_allclose(
        embedded(output / "query-embeddings"), expected_vectors(model, list(queries.values()), None), atol=1e-5
    )
    bad = invoke_shoal("eval", str(data), "--model", "tiny-p", "--query-prompt-name", "qeury", *on_cluster)
    assert bad.returncode == 2 and "no prompt named 'qeury'" in bad.stderr
