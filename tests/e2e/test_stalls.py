"""End-to-end stalls with a real `mlx_lm.server` behind Hangar, over real
sockets: a client that never reads its stream (a 4 KiB receive buffer,
never drained) is cut at `client_stall_timeout_ms` and recorded while
another client is served; a request body that stalls is refused with a 408
before it takes a slot; and unloads answer within a second while a stream
is stalled and right after eight concurrent loads.
"""
from __future__ import annotations

import json
import socket
import threading
import time

from conftest import Server, http, wait_until

LLAMA = "tiny-llama"


def start(env, tmp_path) -> Server:
    settings = tmp_path / "settings.toml"
    settings.write_text(
        '[default_engines]\nmlx = "mlx-lm"\n'
        "[serving]\nclient_stall_timeout_ms = 2000\n"
        f"[models.{LLAMA}]\ndrain_seconds = 2\n"
    )
    proc_env = dict(env["proc_env"], HANGAR_SETTINGS=str(settings))
    return Server("hangar (stalls)", env["base_args"], proc_env)


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def never_reading(env, url: str) -> socket.socket:
    """Posts an endless streamed chat from a socket with a 4 KiB receive
    buffer, and never reads the answer."""
    # The random-weight model would end on its end-of-sequence token after a
    # few hundred tokens, which the socket buffers would hold whole.
    config = json.loads((env["models"] / LLAMA / "config.json").read_text())
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(address(url))
    body = json.dumps({
        "model": LLAMA, "stream": True, "max_tokens": 200000,
        "logit_bias": {str(config["eos_token_id"]): -100},
        "messages": [{"role": "user", "content": "Tell me everything."}],
    }).encode()
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: hangar\r\n"
        b"Content-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
    )
    return sock


def stalled_body(url: str) -> socket.socket:
    sock = socket.create_connection(address(url))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: hangar\r\n"
        b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        b'{"model": "tiny-llama", "mess'
    )
    return sock


def in_flight(url: str) -> int:
    _, body = http(url + "/api/sessions")
    return body["scheduler"]["in_flight"]


def stalls(url: str) -> list[str]:
    _, body = http(url + "/api/events")
    return [e["model"] for e in body["events"] if e["kind"] == "client_stalled"]


def timed_unload(url: str) -> dict:
    started = time.monotonic()
    status, body = http(url + f"/api/models/{LLAMA}/unload", "POST", timeout=30)
    took = time.monotonic() - started
    assert status == 200, body
    assert took < 1.0, f"unload answered in {took:.2f} s: {body}"
    return body


def test_a_never_reading_client_is_cut_while_others_are_served(env, tmp_path):
    srv = start(env, tmp_path)
    try:
        status, body = http(srv.url + f"/api/models/{LLAMA}/load", "POST")
        assert status == 200, body
        reader = never_reading(env, srv.url)
        assert wait_until(lambda: in_flight(srv.url) == 1, 30), srv.log(20)
        body_sock = stalled_body(srv.url)
        # mlx_lm.server generates one request at a time: the other client is
        # answered once the stalled stream is cut, not after it ran 200000
        # tokens.
        status, answer = http(
            srv.url + "/v1/chat/completions", "POST",
            {"model": LLAMA, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
            timeout=60,
        )
        assert status == 200, answer
        assert wait_until(lambda: sorted(stalls(srv.url)) == ["-", LLAMA], 60), stalls(srv.url)
        assert wait_until(lambda: in_flight(srv.url) == 0, 30)
        body_sock.settimeout(10)
        assert body_sock.recv(12) == b"HTTP/1.1 408"
        reader.close()
        body_sock.close()
    finally:
        srv.stop()


def test_unloads_answer_within_a_second_while_a_stream_stalls_and_after_eight_loads(env, tmp_path):
    srv = start(env, tmp_path)
    try:
        results: list[int] = []

        def load():
            results.append(http(srv.url + f"/api/models/{LLAMA}/load", "POST")[0])

        threads = [threading.Thread(target=load) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [200] * 8, results
        assert timed_unload(srv.url)["outcome"] == "unloaded"

        status, body = http(srv.url + f"/api/models/{LLAMA}/load", "POST")
        assert status == 200, body
        reader = never_reading(env, srv.url)
        assert wait_until(lambda: in_flight(srv.url) == 1, 30), srv.log(20)
        answer = timed_unload(srv.url)
        assert answer["outcome"] == "draining", answer
        assert answer["message"].startswith("draining 1 request, done in ≤ 2 s"), answer
        # The drain's deadline ends the stream and stops the engine.
        assert wait_until(lambda: in_flight(srv.url) == 0, 30)
        assert wait_until(lambda: http(srv.url + "/api/sessions")[1]["sessions"] == [], 30)
        reader.close()
    finally:
        srv.stop()
