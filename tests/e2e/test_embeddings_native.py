"""Embeddings and rerank end to end on native-mlx: `hangar serve` with a
model dir of random-weight embedders and a cross-encoder written by
scripts/make_tiny_embedder.py (a BERT with CLS pooling, an XLM-RoBERTa with
mean pooling, a Qwen3 decoder with last-token pooling, an XLM-RoBERTa
reranker). Resolution picks native-mlx (mlx-lm has no embeddings), which
runs them in its worker; the official openai client gets vectors through
Hangar that must equal plugins/native-mlx/tests/embed_reference.py (numpy
from transformers' definitions; mlx-lm for the decoder) within 1e-4, and
`/v1/rerank` scores that equal the reference's, best first.
"""
from __future__ import annotations

import base64
import json
import math
import os
import subprocess

import numpy as np
import openai
import pytest

from conftest import REPO, Server, _run, http

# name -> make_tiny_embedder.py KIND
MODELS = {"mlx-bert": "bert", "mlx-xlmr": "xlmr", "mlx-qwen3-embed": "qwen3", "mlx-ranker": "xlmr-rerank"}
EMBEDDERS = ["mlx-bert", "mlx-xlmr", "mlx-qwen3-embed"]
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Paris is the capital of France.", "Hello, world!"]
QUERY = "What is the capital of France?"
DOCUMENTS = ["Berlin is the capital of Germany.", "Paris is the capital of France.", "A search engine ranks documents."]


@pytest.fixture(scope="module")
def served(env, tmp_path_factory):
    if not os.path.isdir(os.path.join(env["plugins_dir"], "native-mlx")):
        pytest.fail("target/plugins/native-mlx was not built: run scripts/build-plugins.sh")
    tmp = tmp_path_factory.mktemp("embed-native")
    models = tmp / "models"
    models.mkdir()
    make = str(REPO / "scripts" / "make_tiny_embedder.py")
    for name, kind in MODELS.items():
        _run([env["python"], make, kind, str(models / name), "--seed", "3"], f"make_tiny_embedder.py {kind}")
    args = list(env["base_args"])
    args[args.index("--model-dir") + 1] = str(models)
    args[args.index("--state-dir") + 1] = str(tmp / "state")
    srv = Server("hangar (native-mlx embeddings)", args, env["proc_env"])
    srv.models = models
    srv.python = env["python"]
    yield srv
    problems = srv.stop()
    assert not problems, problems


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def reference(served, name: str, **request) -> dict:
    """embed_reference.py's answer for the model folder `name`."""
    script = REPO / "plugins" / "native-mlx" / "tests" / "embed_reference.py"
    request["model"] = str(served.models / name)
    out = subprocess.run([served.python, str(script)], input=json.dumps(request), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def vectors(response) -> np.ndarray:
    data = sorted(response.data, key=lambda d: d.index)
    assert [d.index for d in data] == list(range(len(data))), response
    return np.array([d.embedding for d in data], dtype=np.float64)


def test_the_models_are_listed_with_their_kinds_and_resolve_to_native_mlx(served):
    status, body = http(served.url + "/v1/models")
    assert status == 200, body
    kinds = {m["id"]: m["kind"] for m in body["data"]}
    assert {n: kinds.get(n) for n in MODELS} == {
        "mlx-bert": "embedding", "mlx-xlmr": "embedding", "mlx-qwen3-embed": "embedding", "mlx-ranker": "rerank"}
    for name in MODELS:
        status, body = http(served.url + f"/api/resolve?model={name}")
        assert status == 200 and body["resolution"]["chosen"] == "native-mlx", (name, body)


@pytest.mark.parametrize("name", EMBEDDERS)
def test_vectors_equal_the_reference_and_a_batch_equals_one_by_one(served, client, name):
    want = reference(served, name, texts=TEXTS)
    want = np.array(reference(served, name, inputs=want["ids"])["vectors"])
    batch = client.embeddings.create(model=name, input=TEXTS, encoding_format="float")
    got = vectors(batch)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert float(np.abs(got - want).max()) < 1e-4, float(np.abs(got - want).max())
    assert np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)
    again = vectors(client.embeddings.create(model=name, input=TEXTS, encoding_format="float"))
    assert np.array_equal(got, again), "identical inputs gave different vectors"
    alone = np.array([vectors(client.embeddings.create(model=name, input=t, encoding_format="float"))[0]
                      for t in TEXTS])
    assert float(np.abs(alone - got).max()) < 1e-5, float(np.abs(alone - got).max())
    ids = reference(served, name, texts=TEXTS)["ids"]
    assert batch.usage.prompt_tokens == sum(len(i) for i in ids) == batch.usage.total_tokens, batch.usage


def test_token_ids_and_base64_give_the_same_vectors(served, client):
    ids = reference(served, "mlx-bert", texts=TEXTS[:2])["ids"]
    by_text = vectors(client.embeddings.create(model="mlx-bert", input=TEXTS[:2], encoding_format="float"))
    by_ids = vectors(client.embeddings.create(model="mlx-bert", input=ids, encoding_format="float"))
    assert float(np.abs(by_text - by_ids).max()) < 1e-6
    status, body = http(served.url + "/v1/embeddings", "POST",
                        {"model": "mlx-bert", "input": TEXTS[:2], "encoding_format": "base64"})
    assert status == 200, body
    decoded = np.array([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in body["data"]])
    assert np.array_equal(decoded.astype(np.float64), by_text)


def test_rerank_scores_equal_the_reference_best_first(served):
    # The engine gives the cross-encoder's logits; the route answers their
    # sigmoid, as sentence-transformers' CrossEncoder does for one label.
    logits = reference(served, "mlx-ranker", pairs=[[QUERY, d] for d in DOCUMENTS])["scores"]
    want = [1.0 / (1.0 + math.exp(-x)) for x in logits]
    status, body = http(served.url + "/v1/rerank", "POST", {"model": "mlx-ranker", "query": QUERY,
                                                            "documents": DOCUMENTS})
    assert status == 200, body
    results = body["results"]
    assert sorted(r["index"] for r in results) == [0, 1, 2], results
    for r in results:
        assert abs(r["relevance_score"] - want[r["index"]]) < 1e-4, (r, want)
        assert r["document"]["text"] == DOCUMENTS[r["index"]]
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True), scores
    status, top = http(served.url + "/v1/rerank", "POST", {"model": "mlx-ranker", "query": QUERY,
                                                           "documents": DOCUMENTS, "top_n": 1,
                                                           "return_documents": False})
    assert status == 200, top
    assert [r["index"] for r in top["results"]] == [results[0]["index"]] and "document" not in top["results"][0]


def test_an_input_longer_than_the_model_reads_is_a_400_naming_it(served):
    # The BERT folder's sentence_bert_config.json says max_seq_length 128.
    long = " ".join(["fox"] * 300)
    status, body = http(served.url + "/v1/embeddings", "POST", {"model": "mlx-bert", "input": ["short", long]})
    assert status == 400, body
    assert body["error"]["param"] == "input", body
    assert "'input[1]'" in body["error"]["message"] and "128" in body["error"]["message"], body


def test_the_wrong_kind_of_request_is_a_400_naming_the_models_kind(served, client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="mlx-bert", messages=[{"role": "user", "content": "hi"}])
    assert "embedding" in str(e.value), e.value
    status, body = http(served.url + "/v1/embeddings", "POST", {"model": "mlx-ranker", "input": "hi"})
    assert status == 400 and "rerank" in body["error"]["message"], body
    status, body = http(served.url + "/v1/rerank", "POST", {"model": "mlx-bert", "query": "q", "documents": ["d"]})
    assert status == 400 and "embedding" in body["error"]["message"], body


def test_schemathesis_finds_no_5xx_and_no_mismatch_on_the_embedding_routes(served, tmp_path):
    # Requests pointed at the real embedder and reranker by schemathesis_hooks.py.
    # This server has no API key (the main fuzz run, test_openapi.py, checks auth).
    here = os.path.dirname(os.path.abspath(__file__))
    schemathesis = os.path.join(os.path.dirname(served.python), "schemathesis")
    run = subprocess.run(
        [
            schemathesis, "run", served.url + "/openapi.json",
            "--include-path-regex", r"^/v1/(embeddings|rerank)$|^/ollama/api/(embed|embeddings)$",
            "--checks", "all", "--exclude-checks", "positive_data_acceptance,ignored_auth",
            "--max-examples", "25", "--workers", "1", "--seed", "1",
            "--request-timeout", "60", "--generation-database", "none", "--no-color",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": here, "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
             "HANGAR_FUZZ_EMBEDDER": "mlx-bert", "HANGAR_FUZZ_RERANKER": "mlx-ranker"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600,
    )
    assert run.returncode == 0, f"schemathesis found problems:\n{run.stdout[-12000:]}"
    assert "passed" in run.stdout, run.stdout[-3000:]
