"""End-to-end health with a real `mlx_lm.server`: a request that would kill
its generation thread is refused at the edge; a generation thread killed
behind Hangar's back (the request sent to the engine directly) is noticed
by the readiness poll, the session is failed and the next request starts the
engine afresh; an engine stopped with SIGSTOP is found hung, killed and
recorded, and the next request is served again; at more concurrent streams
than its decode batch it is busy, never failed (issue 30: a busy engine was
once killed with 64 clients on it).
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request

from conftest import Server, http, pid_is_gone, wait_until

LLAMA = "tiny-llama"
MESSAGES = [{"role": "user", "content": "Hello there"}]


def start(env, tmp_path) -> Server:
    settings = tmp_path / "settings.toml"
    settings.write_text(
        '[default_engines]\nmlx = "mlx-lm"\n'
        "[serving]\nfirst_byte_timeout_ms = 5000\nstream_idle_timeout_ms = 5000\n"
        "check_timeout_ms = 1000\nhealth_poll_ms = 200\n"
    )
    proc_env = dict(env["proc_env"], HANGAR_SETTINGS=str(settings))
    return Server("hangar (health)", env["base_args"], proc_env)


def chat(url: str, **extra) -> tuple[int, dict]:
    body = {"model": LLAMA, "messages": MESSAGES, "max_tokens": 4, **extra}
    return http(url + "/v1/chat/completions", "POST", body, timeout=60)


def session(url: str) -> dict:
    status, body = http(url + f"/api/models/{LLAMA}/load", "POST")
    assert status == 200, body
    return body["session"]


def state(url: str) -> str | None:
    _, body = http(url + "/health")
    return body["models"].get(LLAMA, {}).get("state")


def kinds(url: str) -> list[str]:
    _, body = http(url + "/api/events")
    return [e["kind"] for e in body["events"] if e["model"] == LLAMA]


def test_stop_5_is_refused_and_a_dead_generation_thread_is_noticed(env, tmp_path):
    srv = start(env, tmp_path)
    try:
        first = session(srv.url)
        status, body = chat(srv.url, stop=5)
        assert status == 400 and body["error"]["param"] == "stop", body
        status, body = chat(srv.url)
        assert status == 200, body
        # Behind Hangar's back: mlx_lm.server's generation thread dies (and
        # the engine may drop this connection unanswered).
        try:
            http(first["endpoint"] + "/v1/chat/completions", "POST",
                 {"messages": MESSAGES, "max_tokens": 4, "stop": 5}, timeout=30)
        except OSError:
            pass
        assert wait_until(lambda: state(srv.url) == "failed", 10), srv.log(30)
        assert "failed" in kinds(srv.url)
        status, body = chat(srv.url)
        assert status == 200, body
        assert session(srv.url)["pid"] != first["pid"]
    finally:
        problems = srv.stop()
    assert not problems, problems


def test_a_stopped_engine_is_hung_killed_and_served_again(env, tmp_path):
    srv = start(env, tmp_path)
    try:
        first = session(srv.url)
        os.kill(first["pid"], signal.SIGSTOP)
        started = time.monotonic()
        status, body = chat(srv.url)
        took = time.monotonic() - started
        assert status == 504 and body["error"]["code"] == "engine_hung", body
        assert took < 15, took
        assert "hung" in kinds(srv.url)
        assert wait_until(lambda: pid_is_gone(first["pid"]), 5)
        status, body = chat(srv.url)
        assert status == 200, body
    finally:
        problems = srv.stop()
    assert not problems, problems


def stream_chat(url: str, max_tokens: int) -> tuple[int, int, str]:
    """One streamed chat: (status, token events, the last event)."""
    body = {"model": LLAMA, "messages": MESSAGES, "max_tokens": max_tokens, "stream": True}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    tokens, last = 0, ""
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            for line in r:
                if line.startswith(b"data: {"):
                    last = line.decode(errors="replace")
                    if b'"content"' in line:
                        tokens += 1
            return r.status, tokens, last
    except urllib.error.HTTPError as e:
        return e.code, tokens, e.read().decode(errors="replace")


def test_mlx_lm_at_more_streams_than_its_batch_is_busy_not_failed(env, tmp_path):
    # mlx_lm.server decodes 32 requests at a time (--decode-concurrency);
    # 40 streams keep it full and queue the rest while the poll runs every
    # 200 ms. Its readiness route must never end the session under load.
    srv = start(env, tmp_path)
    try:
        first = session(srv.url)
        results: list[tuple[int, int, str]] = []
        def run():
            results.append(stream_chat(srv.url, 48))
        threads = [threading.Thread(target=run) for _ in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        failures = [r for r in results if r[0] != 200 or "error" in r[2]]
        assert not failures, (failures[:3], srv.log(30))
        assert all(tokens > 0 for _, tokens, _ in results), results
        assert "failed" not in kinds(srv.url) and "hung" not in kinds(srv.url), kinds(srv.url)
        assert session(srv.url)["pid"] == first["pid"]
        assert state(srv.url) == "ready"
    finally:
        problems = srv.stop()
    assert not problems, problems
