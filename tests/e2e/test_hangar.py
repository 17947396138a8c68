"""End-to-end: the official `openai` client against `hangar serve`, with
real `mlx_lm.server` engines serving tiny random-weight models.

Random weights produce garbage text, so the tests assert ids, token
counts, finish reasons, shapes, sessions and events, never text.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time

import openai
import pytest

from conftest import (
    REPO, Server, descendants, http, pid_is_gone, proc_cmdline, proc_start_time, proc_status,
    processes_mentioning, wait_until,
)

LLAMA, QWEN = "tiny-llama", "tiny-qwen"
MESSAGES = [{"role": "user", "content": "Hello there, how are you today?"}]


# --------------------------------------------------------------------------
# helpers


def sessions(api) -> list[dict]:
    status, body = api("/api/sessions")
    assert status == 200, body
    return body["sessions"]


def session_of(api, model: str) -> dict | None:
    return next((s for s in sessions(api) if s["model"] == model), None)


def events(api) -> list[dict]:
    status, body = api("/api/events")
    assert status == 200, body
    return body["events"]


def load(api, model: str) -> dict:
    status, body = api(f"/api/models/{model}/load", "POST")
    assert status == 200, body
    return body["session"]


def chat(client, model: str = LLAMA, max_tokens: int = 4, **kw):
    return client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=max_tokens, **kw)


# --------------------------------------------------------------------------
# 1. discovery


def test_01_models_list_and_not_models(client, api):
    ids = sorted(m.id for m in client.models.list())
    assert ids == [LLAMA, QWEN], f"GET /v1/models listed {ids}"

    status, body = api("/api/models")
    assert status == 200, body
    assert sorted(m["model"]["id"] for m in body["models"]) == [LLAMA, QWEN]
    not_models = {os.path.basename(n["path"]): n["reason"] for n in body["not_models"]}
    assert set(not_models) == {"broken", "bad-json"}, body["not_models"]
    assert "safetensors" in not_models["broken"], not_models["broken"]
    assert "JSON" in not_models["bad-json"], not_models["bad-json"]


# --------------------------------------------------------------------------
# 2-4. the OpenAI routes


def test_02_chat_non_streaming(client):
    r = chat(client, max_tokens=8)
    assert r.model == LLAMA
    assert r.object == "chat.completion"
    assert len(r.choices) == 1
    choice = r.choices[0]
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in ("length", "stop")
    assert r.usage is not None
    assert 0 < r.usage.completion_tokens <= 8, r.usage
    assert r.usage.prompt_tokens > 0


def test_03_chat_streaming_with_usage(client):
    stream = chat(client, max_tokens=8, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks, "the stream carried no chunk"
    models = {c.model for c in chunks}
    assert models == {LLAMA}, f"chunk models: {models}"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert isinstance(text, str)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert reasons and reasons[-1] in ("length", "stop"), reasons
    last = chunks[-1]
    assert last.usage is not None, f"the last chunk has no usage: {last}"
    assert 0 < last.usage.completion_tokens <= 8, last.usage


def test_04_completions_on_qwen(client):
    r = client.completions.create(model=QWEN, prompt="Once upon a time", max_tokens=6)
    assert r.model == QWEN
    assert isinstance(r.choices[0].text, str)
    assert r.choices[0].finish_reason in ("length", "stop")
    assert r.usage is not None and 0 < r.usage.completion_tokens <= 6, r.usage

    stream = client.completions.create(
        model=QWEN, prompt="Once upon a time", max_tokens=6, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks
    assert {c.model for c in chunks} == {QWEN}
    text = "".join(c.choices[0].text or "" for c in chunks if c.choices)
    assert isinstance(text, str)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert reasons and reasons[-1] in ("length", "stop"), reasons
    assert chunks[-1].usage is not None and 0 < chunks[-1].usage.completion_tokens <= 6, chunks[-1]


# --------------------------------------------------------------------------
# 5-7. sessions


def test_05_two_models_at_once(client, api, env):
    chat(client, LLAMA)
    client.completions.create(model=QWEN, prompt="hi", max_tokens=4)
    by_model = {s["model"]: s for s in sessions(api)}
    assert set(by_model) == {LLAMA, QWEN}, by_model
    assert {s["plugin"] for s in by_model.values()} == {"mlx-lm"}
    pids = [s["pid"] for s in by_model.values()]
    assert all(isinstance(p, int) and p > 0 for p in pids), pids
    assert pids[0] != pids[1], pids
    for s in by_model.values():
        assert proc_status(s["pid"]).get("State", "").startswith(("S", "R")), (s, proc_status(s["pid"]))
    # The scan that the teardown's orphan check relies on does see engines.
    running = " ".join(processes_mentioning(str(env["models"])))
    assert all(f"{p}: " in running for p in pids), running
    status, health = api("/health")
    assert status == 200 and health["status"] == "healthy", health
    assert {s["model"] for s in health["sessions"]} == {LLAMA, QWEN}


def test_06_concurrent_first_requests_load_once(client, api):
    load(api, LLAMA)
    status, body = api(f"/api/models/{LLAMA}/unload", "POST")
    assert status == 200, body
    assert session_of(api, LLAMA) is None
    before = len(events(api))

    results: list[object] = [None] * 4

    def one(i):
        try:
            results[i] = chat(client, LLAMA, max_tokens=4)
        except Exception as e:  # reported below, with the others
            results[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    failures = [r for r in results if not isinstance(r, openai.types.chat.ChatCompletion)]
    assert not failures, f"concurrent requests failed: {failures!r}"
    assert all(r.model == LLAMA for r in results)

    new = [e for e in events(api)[before:] if e["model"] == LLAMA]
    loads = [e for e in new if e["kind"] == "loaded"]
    assert len(loads) == 1, f"expected exactly one load of {LLAMA}, events: {new}"
    assert not [e for e in new if e["kind"] == "load_failed"], new
    s = session_of(api, LLAMA)
    assert s is not None and s["id"] == loads[0]["session"], (s, loads)
    assert s["requests_served"] >= 4, s


def test_07_engine_killed_mid_stream(client, api):
    old = load(api, LLAMA)
    before = len(events(api))
    prompt = " ".join(["Once upon a time there was a little hangar at the edge of a quiet airfield."] * 20)
    stream = client.chat.completions.create(
        model=LLAMA, messages=[{"role": "user", "content": prompt}], max_tokens=2000, stream=True,
    )
    it = iter(stream)
    first = next(it)
    assert first.model == LLAMA

    s = session_of(api, LLAMA)
    assert s is not None and s["id"] == old["id"], (s, old)
    pid = s["pid"]
    start = proc_start_time(pid)
    keeper = int(proc_status(pid).get("PPid", "0"))
    keeper_start = proc_start_time(keeper)
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()

    received, error = 1, None
    try:
        for chunk in it:
            received += 1
            reason = chunk.choices[0].finish_reason if chunk.choices else None
            assert reason is None, f"the stream finished normally ({reason}) after {received} chunks: not killed in time"
    except openai.APIError as e:
        error = e
    assert error is not None, f"the stream ended without an error after {received} chunks"
    assert not isinstance(error, openai.APIConnectionError), f"torn stream instead of an error event: {error!r}"
    assert "exited" in error.message, error.message
    assert LLAMA in error.message, error.message

    gone = wait_until(lambda: session_of(api, LLAMA) is None, max(0.0, killed_at + 1.0 - time.monotonic()))
    assert gone, f"/api/sessions still lists {LLAMA} 1 s after its engine was killed: {sessions(api)}"
    crashed = wait_until(
        lambda: [e for e in events(api)[before:] if e["kind"] == "crashed" and e["model"] == LLAMA], 1.0
    )
    assert crashed and crashed[0]["session"] == old["id"], events(api)[before:]

    assert wait_until(lambda: pid_is_gone(pid, start), 1.0), (
        f"engine {pid} is still there: {proc_status(pid).get('State')}"
    )
    assert wait_until(lambda: pid_is_gone(keeper, keeper_start), 1.0), (
        f"its keeper {keeper} is still there: {proc_status(keeper).get('State')}"
    )

    r = chat(client, LLAMA)
    assert r.model == LLAMA and r.usage.completion_tokens > 0
    new = session_of(api, LLAMA)
    assert new is not None and new["pid"] != pid and new["id"] != old["id"], (new, old)


# --------------------------------------------------------------------------
# 8. errors


def test_08_errors(client, api):
    with pytest.raises(openai.NotFoundError) as e:
        chat(client, "broken")
    assert e.value.status_code == 404
    assert "broken" in e.value.message and "safetensors" in e.value.message, e.value.message

    r = chat(client, QWEN)
    assert r.model == QWEN and r.usage.completion_tokens > 0

    with pytest.raises(openai.NotFoundError) as e:
        chat(client, "nope")
    assert "nope" in e.value.message
    assert LLAMA in e.value.message and QWEN in e.value.message, e.value.message
    assert e.value.code == "model_not_found", e.value.body

    status, body = api("/v1/chat/completions", "POST", {"messages": MESSAGES, "max_tokens": 4})
    assert status == 400, body
    error = body["error"]
    assert set(error) >= {"message", "type", "param", "code"}, error
    assert error["type"] == "invalid_request_error" and error["param"] == "model", error
    assert "model" in error["message"]

    status, body = api("/v1/chat/completions", "POST", b"{not json")
    assert status == 400 and body["error"]["type"] == "invalid_request_error", body


# --------------------------------------------------------------------------
# 9. management


def test_09_management(api, env):
    status, body = api("/api/plugins")
    assert status == 200, body
    row = next((p for p in body["plugins"] if p["id"] == "mlx-lm"), None)
    assert row is not None, body
    assert row["status"] == "ready", row
    assert row["engine_version"] == "0.32.2", row

    status, body = api(f"/api/resolve?model={LLAMA}")
    assert status == 200, body
    assert body["resolution"]["chosen"] == "mlx-lm", body
    assert body["model"]["id"] == LLAMA

    session = load(api, QWEN)
    status, body = api(f"/api/sessions/{session['id']}/logs")
    assert status == 200, body
    assert body["model"] == QWEN
    assert body["lines"] and all(isinstance(line, str) for line in body["lines"]), body

    status, body = api("/api/sessions/s999999/logs")
    assert status == 404 and "error" in body, body


# --------------------------------------------------------------------------
# 10. API key


def test_10_api_key(env):
    args = env["base_args"] + ["--api-key", "secret"]
    srv = Server("hangar --api-key", args, env["proc_env"])
    try:
        anonymous = openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong", max_retries=0, timeout=30)
        with pytest.raises(openai.AuthenticationError) as e:
            anonymous.models.list()
        assert e.value.status_code == 401

        status, body = http(srv.url + "/v1/models")
        assert status == 401 and body["error"]["type"] == "authentication_error", body
        status, body = http(srv.url + "/api/sessions")
        assert status == 401, body

        keyed = openai.OpenAI(base_url=srv.url + "/v1", api_key="secret", max_retries=0, timeout=30)
        assert sorted(m.id for m in keyed.models.list()) == [LLAMA, QWEN]

        status, body = http(srv.url + "/health")
        assert status == 200 and body["status"] in ("healthy", "loading"), body
    finally:
        problems = srv.stop()
    assert not problems, problems

    # Beyond loopback without a key: refuse to start, and say why.
    try:
        r = subprocess.run(
            env["base_args"] + ["--host", "0.0.0.0"], env=env["proc_env"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"hangar serve --host 0.0.0.0 without a key kept running: {e.stderr!r}")
    assert r.returncode != 0, r.stderr
    assert "api key" in r.stderr.lower(), r.stderr


# --------------------------------------------------------------------------
# 11. shutdown while a model loads


def test_11_sigterm_while_loading(env):
    """SIGTERM while a request waits for its model to load: the host must
    not finish the load and serve the request before exiting; it stops the
    engine that was starting, answers the waiting request with an error, and
    exits within its engines' stop grace (5 s) plus a margin."""
    srv = Server("hangar (shutdown while loading)", env["base_args"], env["proc_env"])
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    prompt = " ".join(["Once upon a time there was a little hangar at the edge of a quiet airfield."] * 20)
    outcome: dict[str, object] = {}

    def request():
        try:
            r = client.chat.completions.create(
                model=QWEN, messages=[{"role": "user", "content": prompt}], max_tokens=2000
            )
            outcome["result"] = f"200 with {r.usage.completion_tokens} tokens ({r.choices[0].finish_reason})"
        except openai.APIError as e:
            outcome["error"] = e

    thread = threading.Thread(target=request)
    problems = []
    try:
        thread.start()
        # Loading, and the engine process spawned: now stop the host.
        spawned = wait_until(
            lambda: http(srv.url + "/health")[1].get("loading") == [QWEN]
            and any("mlx_lm.server" in proc_cmdline(p) for p in descendants(srv.pid)),
            30.0,
        )
        assert spawned, f"{QWEN} never showed as loading with its engine spawned: {http(srv.url + '/health')}"
    finally:
        problems = srv.stop(timeout=10.0, check_zombies=False)
        thread.join(120)
    assert not problems, f"{problems}; the waiting request got: {outcome}"
    assert "result" not in outcome, (
        f"the host finished loading {QWEN} after SIGTERM and served the request ({outcome['result']}) "
        f"before exiting, {srv.stop_seconds:.1f} s after the signal"
    )


# --------------------------------------------------------------------------
# 12. an engine that fails to load its model


def test_12_engine_that_fails_to_load_is_reported_quickly(client, api, env):
    # A folder that discovery accepts (valid config, valid weights) but the
    # engine cannot load: mlx_lm.server's /health turns 503 for good, and the
    # host must say so at once rather than wait out the start timeout. The
    # folder appears while the host runs; the catalog is rescanned at once
    # (POST /api/models/rescan) rather than waiting on the watch's debounce.
    bad = env["models"] / "bad-arch"
    bad.mkdir()
    try:
        config = json.loads((env["models"] / LLAMA / "config.json").read_text())
        config["model_type"] = "no_such_architecture"
        (bad / "config.json").write_text(json.dumps(config))
        for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            shutil.copy(env["models"] / LLAMA / name, bad / name)
        status, rescanned = api("/api/models/rescan", method="POST")
        assert status == 200, rescanned
        assert any(m["model"]["id"] == "bad-arch" for m in rescanned["models"]), rescanned
        start = time.monotonic()
        with pytest.raises(openai.APIStatusError) as e:
            chat(client, "bad-arch")
        took = time.monotonic() - start
        assert e.value.status_code == 503, e.value.body
        assert e.value.code == "engine_start_failed", e.value.body
        assert "no_such_architecture" in e.value.message, e.value.message
        assert took < 30, f"the failed load took {took:.1f} s"
        assert session_of(api, "bad-arch") is None
        assert any(ev["kind"] == "load_failed" and ev["model"] == "bad-arch" for ev in events(api))
        # The other models keep serving.
        assert chat(client, QWEN).usage.completion_tokens > 0
    finally:
        shutil.rmtree(bad)
        api("/api/models/rescan", method="POST")


def test_13_a_quantized_mixture_of_experts_is_served_by_mlx_lm(client, api, env):
    # mlx-lm's quantized experts call `mx.gather_qmm(..., global_scale=...)`,
    # which MLX takes from 0.32.4 on: with mlx-lm 0.32.2 on MLX 0.32.2 every
    # such model failed in mlx_lm.server at its first token (a 502 here).
    # mlx and mlx-cpu are pinned together at 0.32.4 now; this is the model
    # kind that showed it (Qwen3-MoE, 4-bit as mlx_lm.convert writes it).
    python = env["python"]
    dense = env["root"] / "moe-float32"
    moe = env["models"] / "tiny-moe-q4"
    subprocess.run([python, str(REPO / "scripts" / "make_tiny_model.py"), str(dense), "--arch", "qwen3_moe",
                    "--hidden", "128", "--heads", "8"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([python, "-m", "mlx_lm", "convert", "--hf-path", str(dense), "--mlx-path", str(moe),
                    "-q", "--q-bits", "4"], check=True, stdout=subprocess.DEVNULL)
    try:
        status, rescanned = api("/api/models/rescan", method="POST")
        assert status == 200, rescanned
        answer = chat(client, "tiny-moe-q4", max_tokens=8)
        assert answer.usage.completion_tokens > 0, answer
        assert session_of(api, "tiny-moe-q4")["plugin"] == "mlx-lm"
    finally:
        api("/api/models/tiny-moe-q4?force=true", method="DELETE")
        shutil.rmtree(moe, ignore_errors=True)
        api("/api/models/rescan", method="POST")
