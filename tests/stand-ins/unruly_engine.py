#!/usr/bin/env python3
"""A stand-in for an engine that turns unhealthy, is slow, or hangs (tests).

Serves OpenAI-style chat completions on 127.0.0.1:--port, stdlib only, one
thread per request (so /health answers while a request is slow):

- GET /health: 200 {"status":"ok"}; 503 {"status":"unavailable"} once poisoned
  (as mlx_lm.server does after a request kills its generation thread), and
  in busy-503 mode also while any stream is being answered (the readiness
  answer the H200 run saw from mlx_lm.server at 64 streams: 503 under load
  is busy, not failed).
- Streams are served BATCH (default 4) at a time, like an engine's decode
  batch; more wait for a place before their answer starts.
- POST /v1/chat/completions, by the last message's content:
  - "POISON": poisons the engine; this and every later request get 404
    {"error":"generation thread died"};
  - "BUSY503": turns busy-503 mode on (answered like any other request);
  - "SLOW <seconds>": waits that long before answering;
  - anything else: answers `max_tokens` (default 4) tokens "tok ", streamed
    as SSE (TOKEN_MS apart, default 20 ms, then [DONE]) when "stream" is true.
Hangs are made from outside, with SIGSTOP.
"""
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

POISONED = False
BUSY_503 = False
TOKEN_MS = int(os.environ.get("TOKEN_MS", "20"))
BATCH = threading.BoundedSemaphore(int(os.environ.get("BATCH", "4")))
STREAMING = 0
LOCK = threading.Lock()


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
            if POISONED or (BUSY_503 and STREAMING > 0):
                self.send_json(503, {"status": "unavailable"})
            else:
                self.send_json(200, {"status": "ok"})
        else:
            self.send_json(404, {"error": "not found"})

    def do_POST(self):
        global POISONED, BUSY_503
        length = int(self.headers.get("content-length", "0"))
        request = json.loads(self.rfile.read(length) or b"{}")
        content = str(request.get("messages", [{}])[-1].get("content", ""))
        if content == "POISON":
            POISONED = True
        if content == "BUSY503":
            BUSY_503 = True
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
        with BATCH:
            self.stream(n)

    def stream(self, n):
        global STREAMING
        with LOCK:
            STREAMING += 1
        try:
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
        finally:
            with LOCK:
                STREAMING -= 1


def main():
    port = int(sys.argv[sys.argv.index("--port") + 1])
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
