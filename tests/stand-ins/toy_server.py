#!/usr/bin/env python3
"""A stand-in engine for a model format no engine in this repo knows: `.toy`.

The end-to-end test of a third-party plugin (tests/e2e/test_toy_plugin.py)
makes a plugin from `hangar plugin new`'s template for this engine. It is
the smallest OpenAI-compatible server that reads its model from disk, so
the test shows the model file travelled from the model dir, through the
plugin's recognition rule and launch plan, to the engine.

A `.toy` model is a text file: the first line is `TOY1`, the rest is the
reply the model gives to every chat, one word per token.

Usage (the template's flags):
  toy-server --version                  prints `toy-server 1.2.0`
  toy-server --model PATH --host H --port P [--ctx-size N]
PATH is a `.toy` file or a folder holding one.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

VERSION = "1.2.0"


def read_model(path: Path) -> tuple[str, list[str]]:
    """(model id, reply words) of a `.toy` file or a folder holding one."""
    if path.is_dir():
        found = sorted(path.glob("*.toy"))
        if not found:
            sys.exit(f"toy-server: {path} holds no .toy file")
        model_id, path = path.name, found[0]
    else:
        model_id = path.stem
    lines = path.read_text().splitlines()
    if not lines or lines[0].strip() != "TOY1":
        sys.exit(f"toy-server: {path} is not a toy model (its first line is not TOY1)")
    return model_id, " ".join(lines[1:]).split()


def main() -> None:
    parser = argparse.ArgumentParser(prog="toy-server")
    parser.add_argument("--version", action="store_true")
    parser.add_argument("--model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--ctx-size", type=int)
    args = parser.parse_args()
    if args.version:
        print(f"toy-server {VERSION}")
        return
    if not args.model:
        sys.exit("toy-server: no model given (--model)")
    model_id, words = read_model(Path(args.model))
    print(f"toy-server: serving {model_id} ({len(words)} words) on {args.host}:{args.port}", flush=True)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt, *a):  # one line per request on stderr
            sys.stderr.write("toy-server: " + fmt % a + "\n")

        def send_json(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                self.send_json(200, {"status": "ok"})
            elif self.path == "/v1/models":
                self.send_json(200, {"object": "list", "data": [{"id": model_id, "object": "model", "owned_by": "toy"}]})
            else:
                self.send_json(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self):
            if self.path != "/v1/chat/completions":
                return self.send_json(404, {"error": {"message": f"no route {self.path}"}})
            length = int(self.headers.get("Content-Length") or 0)
            try:
                request = json.loads(self.rfile.read(length) or b"{}")
            except ValueError as e:
                return self.send_json(400, {"error": {"message": f"body is not JSON: {e}"}})
            limit = request.get("max_completion_tokens") or request.get("max_tokens") or len(words)
            reply = words[:limit]
            finish = "stop" if len(reply) == len(words) else "length"
            base = {"id": "chatcmpl-toy", "created": int(time.time()), "model": request.get("model", model_id)}
            usage = {"prompt_tokens": 1, "completion_tokens": len(reply), "total_tokens": 1 + len(reply)}
            if not request.get("stream"):
                return self.send_json(200, {
                    **base, "object": "chat.completion", "usage": usage,
                    "choices": [{"index": 0, "finish_reason": finish,
                                 "message": {"role": "assistant", "content": " ".join(reply)}}],
                })
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()

            def event(delta: dict, finish_reason=None) -> None:
                chunk = {**base, "object": "chat.completion.chunk",
                         "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()

            event({"role": "assistant", "content": ""})
            for i, word in enumerate(reply):
                event({"content": word if i == 0 else " " + word})
            event({}, finish)
            self.wfile.write(b"data: [DONE]\n\n")

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
