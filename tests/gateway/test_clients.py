"""The official clients users already hold, with their default settings, against the gateway of the test cluster:
openai (sync and async), langchain-openai's OpenAIEmbeddings, cohere's ClientV2 (and Client), llama-index's
OpenAIEmbedding, and Shoal's own client with 2,048 texts. Every answer is compared with a direct
sentence-transformers call on the same tiny model.

Settings changed from a client's defaults, each the one docs/PROTOCOL.md ("Clients") names:
- every client: its base URL (the gateway's) and an API key (any: auth is off here); llama-index's
  OpenAIEmbedding takes a name outside OpenAI's own through `model_name`, not `model`.
- langchain's defaults tokenize with tiktoken's cl100k_base, whose file tiktoken downloads on first use: the
  test puts it in tiktoken's cache first (TIKTOKEN_CACHE_DIR), as that first use on a machine online would.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest

from shoal.configs import load_catalog
from shoal.pipeline.client import OnlineClient
from shoal.pipeline.cluster import pull_queue

CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"  # what tiktoken fetches
KEY = "unused"  # auth is off: any key is taken


@pytest.fixture(scope="module")
def url(cluster, tiny_catalog):
    """The gateway of the test cluster, serving `tiny` and `tiny-reranker` with the default limits."""
    _, client = cluster
    models = {n: s.model_dump() for n, s in load_catalog(str(tiny_catalog)).models.items()}
    settings = {"port": 0, "request_timeout_seconds": 120}
    reply = client.sync(pull_queue(client).gateway_start, settings=settings, models=models, replace=True)
    with OnlineClient(reply["url"], timeout=120) as online:  # first use loads the models: not a client's concern
        online.encode("tiny", ["warm up"])
        online.rerank("tiny-reranker", "warm", ["up"])
    yield reply["url"]
    client.sync(pull_queue(client).gateway_stop)


@pytest.fixture(scope="module")
def embedder(tiny_model):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(tiny_model), device="cpu")


@pytest.fixture(scope="module")
def texts(demo_texts) -> list[str]:
    return demo_texts[:2048]


def close(got, expected) -> None:
    np.testing.assert_allclose(np.asarray(got, dtype=np.float32), expected, atol=1e-5)


def test_openai_defaults_float_dimensions_a_string_2048_inputs_models_and_errors(url, embedder, texts):
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY)
    direct = embedder.encode(texts)
    answer = client.embeddings.create(model="tiny", input=texts[:100])  # default: base64, decoded by the client
    assert [d.index for d in answer.data] == list(range(100)) and answer.usage.prompt_tokens > 100
    close([d.embedding for d in answer.data], direct[:100])
    floats = client.embeddings.create(model="tiny", input=texts[:10], encoding_format="float")
    close([d.embedding for d in floats.data], direct[:10])
    cut = client.embeddings.create(model="tiny", input=texts[:10], dimensions=16)
    short = direct[:10, :16] / np.linalg.norm(direct[:10, :16], axis=1, keepdims=True)
    close([d.embedding for d in cut.data], short)
    one = client.embeddings.create(model="tiny", input=texts[0])
    assert len(one.data) == 1 and one.model == "tiny"
    close(one.data[0].embedding, direct[0])

    everything = client.embeddings.create(model="tiny", input=texts)  # OpenAI's limit per call: 2,048
    close([d.embedding for d in everything.data], direct)
    assert [d.index for d in everything.data] == list(range(2048))

    assert {"tiny", "tiny-reranker"} <= {m.id for m in client.models.list()}
    with pytest.raises(openai.NotFoundError, match="unknown model 'nope'"):
        client.embeddings.create(model="nope", input="a")
    with pytest.raises(openai.UnprocessableEntityError, match="input is empty"):
        client.embeddings.create(model="tiny", input=[])
    with pytest.raises(openai.UnprocessableEntityError, match="at most 2048"):
        client.embeddings.create(model="tiny", input=texts + ["one more"])


async def test_openai_async_32_calls_at_once(url, embedder, texts):
    import openai

    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY)
    answers = await asyncio.gather(*(client.embeddings.create(model="tiny", input=t) for t in texts[:32]))
    close([a.data[0].embedding for a in answers], embedder.encode(texts[:32]))
    await client.close()


@pytest.fixture
def cl100k_cached(tmp_path, monkeypatch) -> None:
    """tiktoken's cache holding cl100k_base, as after its first download: the shipped file, under tiktoken's key."""
    import tiktoken_ext

    shipped = next(Path(p) / "data" / "cl100k_base.tiktoken" for p in tiktoken_ext.__path__ if Path(p, "data").is_dir())
    shutil.copy(shipped, tmp_path / hashlib.sha1(CL100K_URL.encode()).hexdigest())
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))


def test_langchain_openai_embeddings_with_its_defaults_sends_cl100k_ids_and_gets_the_texts_vectors(
    url, embedder, texts, cl100k_cached
):
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(model="tiny", base_url=f"{url}/v1", api_key=KEY)
    assert embeddings.check_embedding_ctx_length and embeddings.chunk_size == 1000  # the defaults
    documents = texts[:1500]  # two calls of token arrays: 1,000 and 500
    close(embeddings.embed_documents(documents), embedder.encode(documents))
    close(embeddings.embed_query("what do small models do?"), embedder.encode("what do small models do?"))


async def test_langchain_openai_embeddings_sending_text(url, embedder, texts):
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(model="tiny", base_url=f"{url}/v1", api_key=KEY, check_embedding_ctx_length=False)
    documents = texts[:1200]
    close(await embeddings.aembed_documents(documents), embedder.encode(documents))
    close(embeddings.embed_query("a question"), embedder.encode("a question"))


def test_cohere_client_v2_and_v1_rerank_with_top_n(url, tiny_reranker, texts):
    import cohere
    from sentence_transformers import CrossEncoder

    query, documents = "small models on a cluster", texts[:1200]  # more than the old limit of 256
    direct = CrossEncoder(str(tiny_reranker), device="cpu").predict([(query, d) for d in documents])
    best = np.argsort(-direct, kind="stable")[:5]

    reply = cohere.ClientV2(api_key=KEY, base_url=url).rerank(
        model="tiny-reranker", query=query, documents=documents, top_n=5
    )
    assert [r.index for r in reply.results] == best.tolist()
    np.testing.assert_allclose([r.relevance_score for r in reply.results], direct[best], atol=1e-5)

    reply = cohere.Client(api_key=KEY, base_url=url).rerank(
        model="tiny-reranker", query=query, documents=documents[:20], top_n=3, return_documents=True
    )
    top = np.argsort(-direct[:20], kind="stable")[:3]
    assert [(r.index, r.document.text) for r in reply.results] == [(int(i), documents[i]) for i in top]


def test_llama_index_openai_embedding(url, embedder, texts):
    from llama_index.embeddings.openai import OpenAIEmbedding

    embedding = OpenAIEmbedding(model_name="tiny", api_base=f"{url}/v1", api_key=KEY)
    documents = texts[:300]  # three calls of its default 100
    flattened = [t.replace("\n", " ") for t in documents]  # as the client sends them
    close(embedding.get_text_embedding_batch(documents), embedder.encode(flattened))
    close(embedding.get_query_embedding("a question"), embedder.encode("a question"))


def test_2048_texts_on_the_messagepack_route_equal_eight_requests_of_256_and_a_direct_call(url, embedder, texts):
    with OnlineClient(url, timeout=120) as online:  # Shoal's own client: MessagePack, raw float32 bytes
        one = online.encode("tiny", texts)
        eight = np.concatenate([online.encode("tiny", texts[i : i + 256]) for i in range(0, 2048, 256)])
    assert one.shape == (2048, 32)
    np.testing.assert_allclose(one, eight, atol=1e-6)
    close(one, embedder.encode(texts))
