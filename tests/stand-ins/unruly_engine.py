#!/usr/bin/env python3
"""A stand-in for an engine that turns unhealthy, is slow, or hangs (tests).

Serves OpenAI-style chat completions on 127.0.0.1:--port, stdlib only, one
thread per request (so /health answers while a request is slow):

- GET /health: 200 {"status":"ok"}; 503 {"status":"unavailable"} once poisoned
  (as mlx_lm.server does after a request kills its generation thread).
- POST /v1/chat/completions, by the last message's content:
  - "POISON": poisons the engine; this and every later request get 404
    {"error":"generation thread died"};
  - "SLOW <seconds>": waits that long before answering;
  - anything else: answers `max_tokens` (default 4) tokens "tok ", streamed
    as SSE (TOKEN_MS apart, default 20 ms, then [DONE]) when "stream" is true.
Hangs are made from outside, with SIGSTOP.
"""
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

POISONED = False
TOKEN_MS = int(os.environ.get("TOKEN_MS", "20"))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send_json(self, status, value):
        body = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            if POISONED:
                self.send_json(503, {"status": "unavailable"})
            else:
                self.send_json(200, {"status": "ok"})
        else:
            self.send_json(404, {"error": "not found"})

    def do_POST(self):
        global POISONED
        length = int(self.headers.get("content-length", "0"))
        request = json.loads(self.rfile.read(length) or b"{}")
        content = str(request.get("messages", [{}])[-1].get("content", ""))
        if content == "POISON":
            POISONED = True
        if POISONED:
            self.send_json(404, {"error": "generation thread died"})
            return
        if content.startswith("SLOW "):
            time.sleep(float(content.split()[1]))
        n = int(request.get("max_tokens") or 4)
        if not request.get("stream"):
            self.send_json(200, {
                "object": "chat.completion", "model": "x",
                "choices": [{"index": 0, "finish_reason": "length",
                             "message": {"role": "assistant", "content": "tok " * n}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1},
            })
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        for i in range(n):
            chunk = {"object": "chat.completion.chunk", "model": "x",
                     "choices": [{"index": 0, "delta": {"content": "tok "}, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            time.sleep(TOKEN_MS / 1000)
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


def main():
    port = int(sys.argv[sys.argv.index("--port") + 1])
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
