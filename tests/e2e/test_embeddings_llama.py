"""Embeddings end to end on llama.cpp: `hangar serve` with a model dir that
holds a tiny random-weight BERT GGUF (scripts/make_tiny_gguf.py --arch
bert) and a tiny chat GGUF. The catalog reads the BERT's kind from its
metadata, the llama-server WebAssembly plugin starts a real `llama-server
--embeddings` for it, and the official openai and ollama clients get
vectors through Hangar that must equal a numpy forward of the same weights
(tests/e2e/bert_reference.py).
"""
from __future__ import annotations

import base64
import os

import numpy as np
import openai
import pytest

from bert_reference import Bert
from conftest import REPO, Server, _run, http

EMBEDDER = "tiny-bert"
CHAT = "tiny-chat"
DIM = 64
TEXTS = ["the water is very long", "people like little words", "you and them"]
# llama.cpp computes in float32 on the CPU; the reference in float64. The
# difference measured on these weights is about 2e-4.
TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def served(env, tmp_path_factory):
    if not os.path.isdir(os.path.join(env["plugins_dir"], "llama-server")):
        pytest.fail("target/plugins/llama-server was not built: run scripts/build-plugins.sh")
    server_bin = os.path.join(os.path.dirname(env["python"]), "llama-server")
    assert os.path.exists(server_bin), "scripts/python-env.sh links <venv>/bin/llama-server"
    tmp = tmp_path_factory.mktemp("embed-llama")
    models = tmp / "models"
    models.mkdir()
    make = str(REPO / "scripts" / "make_tiny_gguf.py")
    _run([env["python"], make, str(models / f"{EMBEDDER}.gguf"), "--arch", "bert", "--seed", "7"],
         "make_tiny_gguf.py --arch bert")
    _run([env["python"], make, str(models / f"{CHAT}.gguf")], "make_tiny_gguf.py")
    config = tmp / "config.toml"
    config.write_text(
        f'[plugins.llama-server]\nprogram = "{server_bin}"\n[wasm]\ncache_dir = "{tmp / "wasm-cache"}"\n'
    )
    args = list(env["base_args"])
    args[args.index("--model-dir") + 1] = str(models)
    args[args.index("--config") + 1] = str(config)
    args[args.index("--state-dir") + 1] = str(tmp / "state")
    srv = Server("hangar (llama-server embeddings)", args, env["proc_env"])
    srv.bert = Bert(models / f"{EMBEDDER}.gguf")
    yield srv
    problems = srv.stop()
    assert not problems, problems


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def bert(served) -> Bert:
    return served.bert


def vectors(response) -> list[np.ndarray]:
    data = sorted(response.data, key=lambda d: d.index)
    assert [d.index for d in data] == list(range(len(data))), response
    return [np.asarray(d.embedding, dtype=np.float32) for d in data]


def close_to(got: np.ndarray, want: np.ndarray) -> float:
    """The largest difference; asserts it is within TOLERANCE."""
    assert got.shape == want.shape, (got.shape, want.shape)
    diff = float(np.abs(got.astype(np.float64) - want).max())
    assert diff < TOLERANCE, diff
    return diff


def test_v1_models_lists_the_bert_gguf_as_an_embedding_model(served):
    status, body = http(served.url + "/v1/models")
    assert status == 200, body
    kinds = {m["id"]: (m["kind"], m["format"]) for m in body["data"]}
    assert kinds[EMBEDDER] == ("embedding", "gguf"), kinds
    assert kinds[CHAT] == ("chat", "gguf"), kinds


def test_one_string_equals_the_numpy_reference(client, bert):
    r = client.embeddings.create(model=EMBEDDER, input=TEXTS[0], encoding_format="float")
    assert r.model == EMBEDDER and len(r.data) == 1, r
    [v] = vectors(r)
    assert v.shape == (DIM,) and abs(np.linalg.norm(v) - 1) < 1e-5, np.linalg.norm(v)
    close_to(v, bert.embed_text(TEXTS[0]))
    # [CLS], one token per word, [SEP].
    assert r.usage.prompt_tokens == len(bert.tokenize(TEXTS[0])) > 0, r.usage
    assert r.usage.total_tokens == r.usage.prompt_tokens, r.usage


def test_a_list_of_strings_in_order(client, bert):
    r = client.embeddings.create(model=EMBEDDER, input=TEXTS, encoding_format="float")
    got = vectors(r)
    assert len(got) == len(TEXTS), r
    for v, text in zip(got, TEXTS):
        close_to(v, bert.embed_text(text))
    assert r.usage.prompt_tokens == sum(len(bert.tokenize(t)) for t in TEXTS), r.usage


def test_token_ids_are_embedded_as_given(client, bert):
    # Token ids go to the model as they are: no [CLS]/[SEP] is added.
    ids = [bert.tokenize(t) for t in TEXTS]
    [one] = vectors(client.embeddings.create(model=EMBEDDER, input=ids[0], encoding_format="float"))
    close_to(one, bert.embed(ids[0]))
    many = vectors(client.embeddings.create(model=EMBEDDER, input=ids, encoding_format="float"))
    for v, i in zip(many, ids):
        close_to(v, bert.embed(i))
    bare = bert.tokenize(TEXTS[1])[1:-1]
    [v] = vectors(client.embeddings.create(model=EMBEDDER, input=bare, encoding_format="float"))
    close_to(v, bert.embed(bare))
    # The same words as text get [CLS] and [SEP]: the same vector as their ids with them.
    [text] = vectors(client.embeddings.create(model=EMBEDDER, input=TEXTS[0], encoding_format="float"))
    assert np.array_equal(text, one)


def test_float_and_base64_decode_to_the_same_vectors(client):
    floats = vectors(client.embeddings.create(model=EMBEDDER, input=TEXTS, encoding_format="float"))
    raw = client.embeddings.create(model=EMBEDDER, input=TEXTS, encoding_format="base64")
    decoded = [np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in raw.data]
    # Without encoding_format the client asks for base64 and decodes it itself.
    default = vectors(client.embeddings.create(model=EMBEDDER, input=TEXTS))
    for f, b, d in zip(floats, decoded, default):
        assert b.shape == (DIM,)
        assert np.array_equal(f, b) and np.array_equal(f, d), (f[:4], b[:4], d[:4])


def test_identical_inputs_give_identical_vectors_and_a_batch_equals_one_by_one(client):
    twice = vectors(client.embeddings.create(model=EMBEDDER, input=[TEXTS[0], TEXTS[0]], encoding_format="float"))
    assert np.array_equal(twice[0], twice[1])
    again = vectors(client.embeddings.create(model=EMBEDDER, input=TEXTS[0], encoding_format="float"))
    assert np.array_equal(again[0], vectors(client.embeddings.create(
        model=EMBEDDER, input=TEXTS[0], encoding_format="float"))[0])
    batch = vectors(client.embeddings.create(model=EMBEDDER, input=TEXTS, encoding_format="float"))
    for v, text in zip(batch, TEXTS):
        [alone] = vectors(client.embeddings.create(model=EMBEDDER, input=text, encoding_format="float"))
        assert float(np.abs(v - alone).max()) < 1e-5, (text, np.abs(v - alone).max())


def test_dimensions_the_models_own_is_taken_a_smaller_one_is_refused(client, served):
    [v] = vectors(client.embeddings.create(model=EMBEDDER, input=TEXTS[0], dimensions=DIM, encoding_format="float"))
    assert v.shape == (DIM,)
    for wanted in (DIM // 2, DIM + 1):
        with pytest.raises(openai.BadRequestError) as e:
            client.embeddings.create(model=EMBEDDER, input=TEXTS[0], dimensions=wanted)
        body = e.value.body
        assert body["param"] == "dimensions" and str(wanted) in body["message"], body


def test_a_request_of_the_wrong_kind_is_a_400_naming_the_models_kind(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=EMBEDDER, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    body = e.value.body
    assert body["code"] == "wrong_model_kind" and body["param"] == "model", body
    assert "is an embedding model" in body["message"] and "/v1/embeddings" in body["message"], body
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=EMBEDDER, prompt="hi", max_tokens=4)
    assert e.value.body["code"] == "wrong_model_kind", e.value.body
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=CHAT, input="hi")
    body = e.value.body
    assert body["code"] == "wrong_model_kind" and "is a chat model" in body["message"], body


@pytest.mark.parametrize("body, param, says", [
    ({"input": ""}, "input", "empty string"),
    ({"input": []}, "input", "empty list"),
    ({"input": ["the", ""]}, "input", "input[1]"),
    ({"input": [[]]}, "input", "empty list of token ids"),
    ({"input": [5, -1]}, "input", "input[1]"),
    ({"input": [[5, 6], [7, 1.5]]}, "input", "input[1][1]"),
    ({"input": {"text": "the"}}, "input", "must be"),
    ({"input": "the", "encoding_format": "int8"}, "encoding_format", "int8"),
    ({"input": "the", "dimensions": 0}, "dimensions", "dimensions"),
    ({"input": "the", "user": 3}, "user", "user"),
    # An unknown field is named in the message and in param.
    ({"input": "the", "truncate": True}, "truncate", "'truncate' is not supported"),
])
def test_a_malformed_request_is_a_400_naming_the_field(served, body, param, says):
    status, answer = http(served.url + "/v1/embeddings", "POST", {"model": EMBEDDER, **body})
    assert status == 400, answer
    error = answer["error"]
    assert error["param"] == param and says in error["message"], error


def test_a_model_that_is_not_there_is_a_404(served):
    status, answer = http(served.url + "/v1/embeddings", "POST", {"model": "no-such", "input": "the"})
    assert status == 404 and answer["error"]["code"] == "model_not_found", answer


def test_an_unknown_token_id_is_the_clients_400_not_a_500(served, bert):
    status, answer = http(served.url + "/v1/embeddings", "POST",
                          {"model": EMBEDDER, "input": [2, bert.vocab + 10, 3]})
    assert status == 400, answer


def test_an_input_longer_than_the_model_reads_is_the_clients_400_naming_it(served):
    # The tiny BERT has 512 positions; llama-server answers 500 ("too large
    # to process") for longer inputs, which the host passes on as a 400.
    long = " ".join(["the"] * 520)
    for body in ({"input": long}, {"input": ["the", long]}):
        status, answer = http(served.url + "/v1/embeddings", "POST", {"model": EMBEDDER, **body})
        assert status == 400, answer
        error = answer["error"]
        assert error["code"] == "context_length_exceeded" and error["param"] == "input", error


def test_ollama_client_embed_equals_the_openai_route(served, client, bert):
    import ollama

    o = ollama.Client(host=served.url + "/ollama")
    one = o.embed(model=EMBEDDER, input=TEXTS[0])
    assert len(one.embeddings) == 1 and len(one.embeddings[0]) == DIM, one
    assert one.prompt_eval_count == len(bert.tokenize(TEXTS[0])), one
    [want] = vectors(client.embeddings.create(model=EMBEDDER, input=TEXTS[0], encoding_format="float"))
    assert np.array_equal(np.asarray(one.embeddings[0], dtype=np.float32), want)
    many = o.embed(model=EMBEDDER, input=TEXTS)
    wanted = vectors(client.embeddings.create(model=EMBEDDER, input=TEXTS, encoding_format="float"))
    assert len(many.embeddings) == len(TEXTS), many
    for got, w, text in zip(many.embeddings, wanted, TEXTS):
        got = np.asarray(got, dtype=np.float32)
        assert np.array_equal(got, w)
        close_to(got, bert.embed_text(text))
    # The older route, and a name with Ollama's :latest tag.
    old = o.embeddings(model=f"{EMBEDDER}:latest", prompt=TEXTS[0])
    assert np.array_equal(np.asarray(old.embedding, dtype=np.float32), want)
