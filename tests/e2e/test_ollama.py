"""Ollama's API end to end on mlx-lm (the main server), through the official
`ollama` client: `Client(host=URL + "/ollama")` on Hangar's port, and
`--ollama-port` serving the same API at its root. Tags, chat and generate
(streamed and not), `format` refused by an engine without a grammar,
`keep_alive` 0 unloading, errors in Ollama's shape with the right
statuses, `delete` removing a model from disk (a loaded one unloaded
first), and the 501s that say what to use instead.
"""
from __future__ import annotations

import re
import shutil

import ollama
import pytest

from conftest import Server, http, wait_until

LLAMA = "tiny-llama"
USER = [{"role": "user", "content": "Say hi."}]
FEW = {"num_predict": 4, "temperature": 0}


@pytest.fixture(scope="module")
def oc(server) -> ollama.Client:
    return ollama.Client(host=server.url + "/ollama")


def test_tags_list_the_models(oc):
    listed = oc.list()
    names = [m.model for m in listed.models]
    assert LLAMA in names and "tiny-qwen" in names, names
    llama = next(m for m in listed.models if m.model == LLAMA)
    assert llama.size > 0 and len(llama.digest) == 64, llama
    assert llama.details.family == "llama", llama.details
    version = oc._client.get("/api/version").json()["version"]
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", version), version


def test_chat_whole_and_streamed(oc, server):
    answer = oc.chat(model=LLAMA, messages=USER, options=FEW, stream=False)
    assert answer.done and answer.done_reason in ("stop", "length"), answer
    assert answer.message.role == "assistant" and isinstance(answer.message.content, str), answer
    assert answer.eval_count and answer.eval_count <= 4 and answer.prompt_eval_count > 0, answer
    assert answer.total_duration > 0, answer
    # Ollama's default tag names the same model.
    assert oc.chat(model=LLAMA + ":latest", messages=USER, options=FEW, stream=False).done

    lines = list(oc.chat(model=LLAMA, messages=USER, options=FEW, stream=True))
    assert len(lines) >= 2 and lines[-1].done and not any(l.done for l in lines[:-1]), lines
    assert lines[-1].done_reason in ("stop", "length") and lines[-1].eval_count, lines[-1]
    text = "".join(l.message.content or "" for l in lines)
    assert text, lines
    # Counted like the chat routes, under its own route.
    status, metrics = http(server.url + "/metrics")
    line = f'hangar_requests_total{{model="{LLAMA}",route="/ollama/api/chat",status="200"}}'
    assert line in metrics, [l for l in metrics.splitlines() if "requests_total" in l]


def test_generate_whole_streamed_and_raw(oc):
    answer = oc.generate(model=LLAMA, prompt="Once upon a time", system="Be brief.", options=FEW)
    assert answer.done and isinstance(answer.response, str) and answer.eval_count, answer
    lines = list(oc.generate(model=LLAMA, prompt="Once upon a time", options=FEW, stream=True))
    assert lines[-1].done and lines[-1].done_reason in ("stop", "length"), lines[-1]
    assert "".join(l.response for l in lines), lines
    raw = oc.generate(model=LLAMA, prompt="1, 2, 3,", raw=True, options=FEW)
    assert raw.done and raw.eval_count, raw


def test_the_ndjson_is_one_object_a_line(server):
    import urllib.request, json
    body = json.dumps({"model": LLAMA, "prompt": "hi", "options": FEW}).encode()
    req = urllib.request.Request(server.url + "/ollama/api/generate", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.headers["Content-Type"] == "application/x-ndjson", r.headers
        lines = [json.loads(l) for l in r.read().decode().splitlines()]
    assert lines[-1]["done"] is True and all(l["done"] is False for l in lines[:-1]), lines
    for key in ("total_duration", "load_duration", "prompt_eval_count", "eval_count", "eval_duration"):
        assert isinstance(lines[-1][key], int), (key, lines[-1])


def test_format_is_refused_by_an_engine_without_a_grammar(oc):
    # mlx-lm has no grammar engine: a 400 naming the capability.
    for fmt in ("json", {"type": "object", "properties": {"a": {"type": "integer"}}}):
        with pytest.raises(ollama.ResponseError) as e:
            oc.chat(model=LLAMA, messages=USER, options=FEW, format=fmt, stream=False)
        assert e.value.status_code == 400 and "structured_output" in e.value.error, e.value.error


def sessions_of(server, model: str) -> list:
    status, body = http(server.url + "/api/sessions")
    return [s for s in body["sessions"] if s["model"] == model]


def test_keep_alive_0_unloads_and_ps_shows_the_loaded(oc, server):
    # No prompt: Ollama's way to load a model.
    loaded = oc.generate(model=LLAMA, keep_alive="10m")
    assert loaded.done and loaded.done_reason == "load", loaded
    ps = oc.ps()
    assert LLAMA in [m.model for m in ps.models], ps
    assert sessions_of(server, LLAMA)
    # An answer with keep_alive 0 unloads the model once it is sent.
    answer = oc.chat(model=LLAMA, messages=USER, options=FEW, keep_alive=0, stream=False)
    assert answer.done, answer
    assert wait_until(lambda: not sessions_of(server, LLAMA), 15.0), sessions_of(server, LLAMA)
    # And without a prompt, keep_alive 0 unloads too.
    oc.generate(model=LLAMA, keep_alive=-1)
    assert sessions_of(server, LLAMA)
    unloaded = oc.generate(model=LLAMA, keep_alive=0)
    assert unloaded.done_reason == "unload", unloaded
    assert wait_until(lambda: not sessions_of(server, LLAMA), 15.0), sessions_of(server, LLAMA)


def error_of(call) -> tuple[int, str]:
    with pytest.raises(ollama.ResponseError) as e:
        call()
    return e.value.status_code, e.value.error


def test_errors_in_ollamas_shape(oc, server):
    status, error = error_of(lambda: oc.chat(model="no-such-model", messages=USER, stream=False))
    assert status == 404 and "model 'no-such-model' not found" in error, error
    status, error = error_of(lambda: oc.chat(model=LLAMA, messages=USER, options={"warmth": 1}, stream=False))
    assert status == 400 and "'options.warmth'" in error, error
    status, error = error_of(lambda: oc.chat(model=LLAMA, messages=USER, options={"temperature": 9}, stream=False))
    assert status == 400 and "'options.temperature'" in error, error
    status, error = error_of(lambda: oc.generate(model=LLAMA, prompt="x", keep_alive="soon"))
    assert status == 400 and "'keep_alive'" in error, error
    status, error = error_of(lambda: oc.generate(model=LLAMA, prompt="x", suffix="y"))
    assert status == 400 and "'suffix'" in error, error
    status, error = error_of(lambda: oc.generate(model=LLAMA, prompt="x", images=[b"\x89PNG"]))
    assert status == 400 and "vision" in error, error
    # Ignored options Ollama defines are served.
    assert oc.chat(model=LLAMA, messages=USER, options={**FEW, "num_ctx": 2048, "repeat_penalty": 1.1},
                   stream=False).done
    # Raw: a body that is not JSON, and the error's shape.
    status, body = http(server.url + "/ollama/api/chat", "POST", b"{not json")
    assert status == 400 and set(body) == {"error"}, body


def test_what_hangar_lacks_is_a_501_saying_what_instead(oc, server):
    # Embeddings are served, by embedding models: a chat model's are a 400
    # naming its kind (test_embeddings_llama.py embeds through this route).
    status, error = error_of(lambda: oc.embed(model=LLAMA, input="hi"))
    assert status == 400 and "chat model" in error, error
    status, error = error_of(lambda: oc.pull(LLAMA))
    assert status == 501 and "POST /api/models/pull" in error and "hangar pull" in error, error
    status, error = error_of(lambda: oc.copy(LLAMA, "other"))
    assert status == 501 and "folder" in error, error


def test_delete_removes_the_model_and_unloads_it_first(env, tmp_path):
    """`delete` through the official client, on a host of its own (it
    removes what it is asked to)."""
    models = tmp_path / "models"
    for name in ("doomed", "running"):
        shutil.copytree(env["models"] / "tiny-llama", models / name)
    (tmp_path / "state").mkdir()
    args = list(env["base_args"])
    args[args.index("--model-dir") + 1] = str(models)
    args[args.index("--state-dir") + 1] = str(tmp_path / "state")
    srv = Server("hangar (ollama delete)", args, env["proc_env"])
    try:
        oc = ollama.Client(host=srv.url + "/ollama")
        assert oc.delete("doomed").status == "success"
        assert not (models / "doomed").exists()
        assert "doomed" not in [m.model for m in oc.list().models]
        # Gone: a 404 in Ollama's words, as for any unknown model.
        status, error = error_of(lambda: oc.delete("doomed"))
        assert status == 404 and "model 'doomed' not found" in error, error
        # A loaded model is unloaded first (Ollama's API has no force);
        # the default tag names it too.
        oc.generate(model="running", keep_alive=-1)
        assert [m.model for m in oc.ps().models] == ["running"]
        assert oc.delete("running:latest").status == "success"
        assert not (models / "running").exists() and oc.ps().models == []
        # A body without the model is a 400 naming the field.
        status, body = http(srv.url + "/ollama/api/delete", "DELETE", {"modle": "x"})
        assert status == 400 and "'modle'" in body["error"], body
        status, body = http(srv.url + "/ollama/api/delete", "DELETE", {})
        assert status == 400 and "'model' is required" in body["error"], body
        status, events = http(srv.url + "/api/events")
        assert "unloaded" in [e["kind"] for e in events["events"] if e["model"] == "running"], events
    finally:
        problems = srv.stop()
    assert not problems, problems


def test_the_ollama_port_serves_at_its_root(env):
    srv = Server("hangar --ollama-port", env["base_args"] + ["--ollama-port", "0"], env["proc_env"])
    try:
        found = wait_until(lambda: re.search(r"Ollama's API on (http://\S+)", srv.log()), 10.0)
        assert found, srv.log()
        url = found.group(1)
        status, text = http(url + "/")
        assert status == 200 and text == "Ollama is running", text
        root = ollama.Client(host=url)
        assert LLAMA in [m.model for m in root.list().models]
        assert root.chat(model=LLAMA, messages=USER, options=FEW, stream=False).done
        # Hangar's management API is not there.
        status, body = http(url + "/api/models")
        assert status == 404 and "error" in body, body
    finally:
        problems = srv.stop()
    assert not problems, problems
