#!/usr/bin/env python3
"""A protocol-faithful stand-in for Lablup's `mlxcel-server`, for tests.

Written from ../../../shared/reference/engines.md alone (never from Hangar's
plugin), so that it catches the plugin's mistakes. It pretends to be the
version in MLXCEL_STANDIN_VERSION (default 0.4.2) and, like the real clap
binary, refuses (exit 2) any flag that version did not have. It records its
argv (stderr line `mlxcel-server argv: [...]`, and MLXCEL_STANDIN_ARGV_FILE
if set), answers /health with 503 "loading model" for MLXCEL_STANDIN_LOAD_MS
(default 300) and then 200, and serves OpenAI-compatible chat and text
completions, streaming or not, with deterministic fake tokens.
"""
from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
import tomllib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NAME = "mlxcel-server"
VERSION_TEXT = os.environ.get("MLXCEL_STANDIN_VERSION", "0.4.2")
_m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", VERSION_TEXT)
VERSION = tuple(int(x) for x in _m.groups()) if _m else None  # None: unparseable

# Flags from the reference: (names, takes a value, allowed values or a check,
# first version). Basic flags exist in every version.
BASIC = (0, 0, 0)
FLAGS = [
    (("-m", "--model"), True, None, BASIC),
    (("-a", "--alias"), True, None, BASIC),
    (("--host",), True, None, BASIC),
    (("--port",), True, "int", BASIC),
    (("-c", "--ctx-size"), True, "int", BASIC),
    (("-n", "--predict"), True, "int", BASIC),
    (("--parallel",), True, "int", BASIC),
    (("--api-key",), True, None, BASIC),
    (("--timeout",), True, "int", BASIC),
    (("--chat-template",), True, None, BASIC),
    (("--chat-template-file",), True, None, BASIC),
    (("--chat-template-kwargs",), True, "json", BASIC),
    (("--no-warmup",), False, None, BASIC),
    (("--metrics",), False, None, BASIC),
    (("--props",), False, None, BASIC),
    # speculative (classic draft model)
    (("--model-draft", "--draft-model"), True, None, (0, 0, 1)),
    (("--draft", "--draft-max"), True, "int", (0, 0, 1)),
    # KV cache quantization (int8); turbo4 from 0.0.26
    (("--cache-type-k",), True, "cache-type", (0, 0, 14)),
    (("--cache-type-v",), True, "cache-type", (0, 0, 14)),
    (("--tp-size",), True, "int", (0, 0, 20)),
    (("--decode-storage-backend",), True, ("auto", "dense", "paged"), (0, 0, 21)),
    (("--distributed-config",), True, "toml-file", (0, 0, 22)),
    (("--node-id",), True, None, (0, 0, 22)),
    (("--node-role",), True, "node-role", (0, 0, 22)),
    (("--pp-layers",), True, None, (0, 0, 22)),
    (("--pp-auto",), True, "int", (0, 0, 24)),
    (("--cluster-discovery",), True, ("mdns",), (0, 0, 24)),
    (("--cluster-peers",), True, None, (0, 0, 24)),
    (("--prompt-cache-enabled",), False, None, (0, 0, 25)),
    (("--no-prompt-cache",), False, None, (0, 0, 25)),
    (("--prompt-cache-capacity-bytes",), True, "int", (0, 0, 25)),
    (("--prompt-cache-ttl",), True, "int", (0, 0, 25)),
    (("--reasoning-budget",), True, "budget", (0, 0, 25)),
    (("--kv-bits",), True, "int", (0, 0, 26)),
    (("--apc-enabled",), False, None, (0, 0, 26)),
    (("--apc-block-size",), True, "int", (0, 0, 26)),
    (("--draft-kind",), True, ("dflash", "mtp"), (0, 0, 27)),
    (("--draft-block-size",), True, "int", (0, 0, 27)),
    (("--kv-cache-budget",), True, "kv-budget", (0, 2, 0)),
]


def has(first: tuple) -> bool:
    """Whether this version has a feature first shipped in `first`; an
    unparseable version has only the basic flags."""
    if first == BASIC:
        return True
    return VERSION is not None and VERSION >= first


def usage_error(message: str) -> None:
    sys.stderr.write(f"error: {message}\n\nUsage: {NAME} [OPTIONS]\n\nFor more information, try '--help'.\n")
    sys.exit(2)


def check_value(flag: str, kind, value: str):
    bad = lambda: usage_error(f"invalid value '{value}' for '{flag} <{flag.lstrip('-').upper()}>'")
    if kind is None:
        return value
    if isinstance(kind, tuple):
        if value not in kind:
            bad()
        return value
    if kind == "int":
        if not re.fullmatch(r"-?\d+", value):
            bad()
        return int(value)
    if kind == "budget":
        if not re.fullmatch(r"-?\d+", value) or int(value) < -1:
            bad()
        return int(value)
    if kind == "json":
        try:
            return json.loads(value)
        except ValueError:
            bad()
    if kind == "cache-type":
        allowed = ["fp16", "int8"] + (["turbo4"] if has((0, 0, 26)) else [])
        if value not in allowed:
            bad()
        return value
    if kind == "node-role":
        allowed = ["prefill", "decode", "router"] if has((0, 2, 0)) else []
        # Before 0.2.0 the reference names no role values; accept any word.
        if allowed and value not in allowed:
            bad()
        return value
    if kind == "kv-budget":
        if value not in ("auto", "none") and not value.isdigit():
            bad()
        return value
    if kind == "toml-file":
        try:
            with open(value, "rb") as f:
                content = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as e:
            sys.stderr.write(f"error: cannot read distributed config {value}: {e}\n")
            sys.exit(1)
        sys.stderr.write(f"{NAME} distributed-config: {json.dumps(content, sort_keys=True)}\n")
        return value
    raise AssertionError(kind)


def parse(argv: list[str]) -> dict:
    known = {name: spec for spec in FLAGS if has(spec[3]) for name in spec[0]}
    options: dict = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-V", "--version"):
            print(f"{NAME} {VERSION_TEXT}")
            sys.exit(0)
        if arg in ("-h", "--help"):
            print(f"Usage: {NAME} [OPTIONS]\n\nOptions:")
            for names, takes, _, first in FLAGS:
                if has(first):
                    print(f"  {', '.join(names)}{' <VALUE>' if takes else ''}")
            sys.exit(0)
        name, eq, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        spec = known.get(name)
        if spec is None:
            usage_error(f"unexpected argument '{name}' found")
        names, takes, kind, _ = spec
        key = names[-1].lstrip("-")
        if takes:
            if eq:
                value = inline
            else:
                i += 1
                if i >= len(argv):
                    usage_error(f"a value is required for '{name} <{key.upper()}>' but none was supplied")
                value = argv[i]
            options[key] = check_value(name, kind, value)
        else:
            if eq:
                usage_error(f"unexpected value '{inline}' for '{name}' found; no more were expected")
            options[key] = True
        i += 1
    return options


def main() -> None:
    argv = sys.argv[1:]
    options = parse(argv)
    sys.stderr.write(f"{NAME} argv: {json.dumps(argv)}\n")
    if os.environ.get("MLXCEL_STANDIN_ARGV_FILE"):
        with open(os.environ["MLXCEL_STANDIN_ARGV_FILE"], "w") as f:
            json.dump(argv, f)
    model = options.get("model")
    if not model:
        usage_error("the following required arguments were not provided:\n  --model <MODEL>")
    if not os.path.isfile(os.path.join(model, "config.json")):
        sys.stderr.write(f"error: failed to load model {model}: config.json not found\n")
        sys.exit(1)
    state = {
        "options": options,
        "alias": options.get("alias") or model,
        "ready_at": time.monotonic() + int(os.environ.get("MLXCEL_STANDIN_LOAD_MS", "300")) / 1000,
        "slots": threading.Semaphore(int(options.get("parallel", 4 if has((0, 4, 0)) else 1))),
    }
    Handler.state = state
    server = ThreadingHTTPServer((options.get("host", "127.0.0.1"), int(options.get("port", 8080))), Handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    sys.stderr.write(f"{NAME} {VERSION_TEXT} listening on {server.server_address[0]}:{server.server_address[1]}\n")
    server.serve_forever()


def error_body(message: str, kind: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


class Handler(BaseHTTPRequestHandler):
    state: dict = {}
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # keep stderr for the argv line and errors
        pass

    def route(self) -> str:
        path = self.path.split("?", 1)[0]
        return path[3:] if path.startswith("/v1/") else path

    def send_json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def authorized(self) -> bool:
        key = self.state["options"].get("api-key")
        if key and self.headers.get("Authorization") != f"Bearer {key}":
            self.send_json(401, error_body("invalid api key", "authentication_error"))
            return False
        return True

    def do_GET(self):
        route = self.route()
        if route == "/health":
            if time.monotonic() < self.state["ready_at"]:
                return self.send_json(503, {"status": "loading model"})
            return self.send_json(200, {"status": "ok"})
        if not self.authorized():
            return
        if route == "/models":
            return self.send_json(200, {"object": "list", "data": [
                {"id": self.state["alias"], "object": "model", "owned_by": "mlxcel"}]})
        self.send_json(404, error_body(f"no route {self.path}"))

    def do_POST(self):
        route = self.route()
        if not self.authorized():
            return
        if route not in ("/chat/completions", "/completions"):
            return self.send_json(404, error_body(f"no route {self.path}"))
        if time.monotonic() < self.state["ready_at"]:
            return self.send_json(503, error_body("loading model", "unavailable_error"))
        length = int(self.headers.get("Content-Length", "0"))
        try:
            request = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            return self.send_json(400, error_body("request body is not JSON"))
        if "thinking_budget_tokens" in request and not has((0, 0, 25)):
            return self.send_json(400, error_body("unknown field `thinking_budget_tokens`"))
        chat = route == "/chat/completions"
        if chat:
            words = " ".join(str(m.get("content", "")) for m in request.get("messages", [])).split()
        else:
            words = str(request.get("prompt", "")).split()
        max_tokens = int(request.get("max_tokens") or self.state["options"].get("predict") or 16)
        model = request.get("model") or self.state["alias"]
        if not self.state["slots"].acquire(blocking=False):
            return self.send_json(503, {"status": "no slot available"})
        try:
            self.answer(chat, request, model, len(words), max_tokens)
        finally:
            self.state["slots"].release()

    def answer(self, chat: bool, request: dict, model: str, prompt_tokens: int, max_tokens: int) -> None:
        created, rid = int(time.time()), f"{'chatcmpl' if chat else 'cmpl'}-standin-{time.monotonic_ns()}"
        tokens = [f"tok{i} " for i in range(max_tokens)]
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens,
                 "total_tokens": prompt_tokens + max_tokens}
        if not request.get("stream"):
            text = "".join(tokens)
            choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                      if chat else {"index": 0, "text": text, "finish_reason": "length"})
            return self.send_json(200, {"id": rid, "object": "chat.completion" if chat else "text_completion",
                                        "created": created, "model": model, "choices": [choice], "usage": usage})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        obj = "chat.completion.chunk" if chat else "text_completion"

        def send(payload) -> None:
            data = payload if isinstance(payload, str) else json.dumps(payload)
            self.wfile.write(f"data: {data}\n\n".encode())
            self.wfile.flush()

        try:
            for i, tok in enumerate(tokens):
                choice = ({"index": 0, "delta": ({"role": "assistant"} if i == 0 else {}) | {"content": tok},
                           "finish_reason": None} if chat else {"index": 0, "text": tok, "finish_reason": None})
                send({"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]})
            last = ({"index": 0, "delta": {}, "finish_reason": "length"} if chat
                    else {"index": 0, "text": "", "finish_reason": "length"})
            send({"id": rid, "object": obj, "created": created, "model": model, "choices": [last]})
            if (request.get("stream_options") or {}).get("include_usage"):
                send({"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": usage})
            send("[DONE]")
        except (BrokenPipeError, ConnectionResetError):
            pass


if __name__ == "__main__":
    main()
