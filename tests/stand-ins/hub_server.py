#!/usr/bin/env python3
"""A stand-in of a Hugging Face-compatible hub's HTTP API, written from the
hub's public API documentation (huggingface.co/docs/hub/api and the
`huggingface_hub` download guide), stdlib only.

    python3 hub_server.py --repos DIR [--port 0] [--gated ORG/NAME] [--token T]
        [--corrupt PATH] [--break-after N] [--huge ORG/NAME] [--throttle BYTES_PER_S]

DIR holds one folder per repository, `DIR/ORG/NAME/` (its files are the
repository's files at one commit, whose hash is the SHA-1 of the file list).
Routes:
- `GET /api/models?search=TEXT&limit=N`: the repositories whose id holds
  TEXT (case-insensitive), `[{"id", "modelId", "downloads", "likes",
  "private", "tags"}]`, at most N (default 20), as the hub's model search.
- `GET /api/models/ORG/NAME[/revision/REV][?blobs=true]`: model info,
  `{"id", "sha", "siblings": [{"rfilename", "size", "blobId", "lfs"?}]}`;
  files over 1 KiB (and every *.safetensors / *.gguf) are "LFS" files with
  `lfs: {"sha256", "size", "pointerSize"}`. Revisions `main` and the commit
  hash are known; anything else is 404 (`X-Error-Code: RevisionNotFound`).
- `GET|HEAD /ORG/NAME/resolve/REV/PATH`: a small file is answered directly;
  an LFS file is a 302 to `/cdn/SHA256` (as the hub redirects to its CDN),
  with `X-Repo-Commit`, `X-Linked-Etag`, `X-Linked-Size`. `/cdn/SHA256`
  serves the bytes with `ETag`, `Accept-Ranges: bytes` and `Range: bytes=N-`
  (206 with `Content-Range`; 416 past the end).
- `GET /_stats`: `{"bytes": {PATH: bytes served}, "requests": [...]}`, for tests.
- `GET /_throttle?bps=N`: serve file bytes at N bytes per second from now on
  (0: at full speed), for tests that need a pull still running.
Options: `--gated REPO` answers 401 to that repository without
`Authorization: Bearer TOKEN` (`--token`, default `hf_test`); `--corrupt PATH`
flips one byte of PATH as served (its metadata stays right); `--break-after N`
makes the first download of an LFS file stop after N bytes (the connection
closes; `--break-mode stall` keeps it open and silent instead); `--huge REPO`
lists every file of REPO as 1 PiB; `--throttle N` starts as `/_throttle?bps=N`. The listening line is `hub: listening on
http://HOST:PORT`.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

LFS_MIN = 1024
CHUNK = 1 << 20


class Repo:
    def __init__(self, name: str, root: Path, huge: bool):
        self.name = name
        self.root = root
        self.files: dict[str, dict] = {}
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            rel = path.relative_to(root).as_posix()
            data_len = path.stat().st_size
            sha = hashlib.sha256(path.read_bytes()).hexdigest()
            blob = hashlib.sha1(b"blob %d\0" % data_len + path.read_bytes()).hexdigest()
            lfs = data_len > LFS_MIN or rel.endswith((".safetensors", ".gguf"))
            self.files[rel] = {"path": path, "size": (1 << 50) if huge else data_len,
                               "sha256": sha, "blob": blob, "lfs": lfs}
        listing = "\n".join(f"{k} {v['sha256']}" for k, v in self.files.items())
        self.commit = hashlib.sha1(listing.encode()).hexdigest()

    def info(self) -> dict:
        siblings = []
        for rel, f in self.files.items():
            s = {"rfilename": rel, "size": f["size"], "blobId": f["blob"]}
            if f["lfs"]:
                s["lfs"] = {"sha256": f["sha256"], "size": f["size"], "pointerSize": 134}
            siblings.append(s)
        return {"_id": self.commit[:24], "id": self.name, "modelId": self.name, "sha": self.commit,
                "private": False, "gated": False, "siblings": siblings}


class State:
    def __init__(self, args):
        self.args = args
        self.repos: dict[str, Repo] = {}
        root = Path(args.repos)
        for org in sorted(p for p in root.iterdir() if p.is_dir()):
            for name in sorted(p for p in org.iterdir() if p.is_dir()):
                repo = f"{org.name}/{name.name}"
                self.repos[repo] = Repo(repo, name, repo in args.huge)
        self.by_sha = {f["sha256"]: (r, rel) for r in self.repos.values() for rel, f in r.files.items()}
        self.lock = threading.Lock()
        self.served: dict[str, int] = {}
        self.requests: list[str] = []
        self.broken: set[str] = set()
        self.throttle: int = args.throttle


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: State

    def log_message(self, *a):
        pass

    def send_json(self, code: int, body: object, headers: dict | None = None):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def authorised(self, repo: str) -> bool:
        if repo not in self.state.args.gated:
            return True
        return self.headers.get("Authorization") == f"Bearer {self.state.args.token}"

    def repo_at(self, repo: str, rev: str):
        """The repository at `rev`, or None once the hub's refusal is sent
        (unknown repository, gated without the token, unknown revision)."""
        r = self.state.repos.get(repo)
        if r is None:
            self.send_json(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
        elif not self.authorised(repo):
            self.send_json(401, {"error": f"Access to model {repo} is restricted."}, {"X-Error-Code": "GatedRepo"})
        elif rev not in ("main", r.commit):
            self.send_json(404, {"error": f"Invalid rev id: {rev}"}, {"X-Error-Code": "RevisionNotFound"})
        else:
            return r
        return None

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        url = urlsplit(self.path)
        path = unquote(url.path)
        st = self.state
        with st.lock:
            st.requests.append(f"{self.command} {self.path} range={self.headers.get('Range')}")
        if path == "/_stats":
            with st.lock:
                return self.send_json(200, {"bytes": st.served, "requests": st.requests})
        query = parse_qs(url.query)
        if path == "/_throttle":
            with st.lock:
                st.throttle = int(query.get("bps", ["0"])[0])
            return self.send_json(200, {"bps": st.throttle})
        if path in ("/api/models", "/api/models/"):
            text = query.get("search", [""])[0].lower()
            limit = int(query.get("limit", ["20"])[0])
            found = [{"_id": r.commit[:24], "id": r.name, "modelId": r.name, "downloads": 0, "likes": 0,
                      "private": False, "tags": []}
                     for r in st.repos.values() if text in r.name.lower()]
            return self.send_json(200, found[:limit])
        if path.startswith("/api/models/"):
            rest = path[len("/api/models/"):]
            repo, _, rev = rest.partition("/revision/")
            r = self.repo_at(repo, rev or "main")
            return None if r is None else self.send_json(200, r.info())
        if path.startswith("/cdn/"):
            return self.serve_blob(path[len("/cdn/"):])
        parts = path.lstrip("/").split("/")
        if len(parts) >= 5 and parts[2] == "resolve":
            repo, rev, rel = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
            r = self.repo_at(repo, rev)
            if r is None:
                return None
            f = r.files.get(rel)
            if f is None:
                return self.send_json(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
            common = {"X-Repo-Commit": r.commit}
            if f["lfs"]:
                self.send_response(302)
                self.send_header("Location", f"/cdn/{f['sha256']}")
                self.send_header("X-Repo-Commit", r.commit)
                self.send_header("X-Linked-Etag", f'"{f["sha256"]}"')
                self.send_header("X-Linked-Size", str(f["size"]))
                self.send_header("ETag", f'"{f["blob"]}"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            return self.serve_file(r, rel, f, {**common, "ETag": f'"{f["blob"]}"'})
        return self.send_json(404, {"error": "Not found"})

    def serve_blob(self, sha: str):
        found = self.state.by_sha.get(sha)
        if found is None:
            return self.send_json(404, {"error": "Not found"})
        r, rel = found
        f = r.files[rel]
        self.serve_file(r, rel, f, {"ETag": f'"{sha}"', "X-Repo-Commit": r.commit})

    def serve_file(self, r: Repo, rel: str, f: dict, headers: dict):
        st = self.state
        data = f["path"].read_bytes()
        if rel in st.args.corrupt and data:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        start = 0
        status = 200
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            first = rng[len("bytes="):].split("-", 1)[0]
            start = int(first or 0)
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        body = data[start:]
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(body)))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command == "HEAD":
            return
        limit = len(body)
        breaking = False
        with st.lock:
            if st.args.break_after is not None and f["lfs"] and rel not in st.broken:
                st.broken.add(rel)
                limit = min(limit, st.args.break_after)
                breaking = True
        sent = 0
        view = memoryview(body)
        try:
            while sent < limit:
                throttle = st.throttle
                n = min(CHUNK if throttle <= 0 else max(1, throttle // 10), limit - sent)
                self.wfile.write(view[sent:sent + n])
                sent += n
                if throttle > 0:
                    self.wfile.flush()
                    time.sleep(n / throttle)
                with st.lock:
                    st.served[rel] = st.served.get(rel, 0) + n
            if breaking:
                self.wfile.flush()
                if st.args.break_mode == "stall":
                    time.sleep(3600)
                self.close_connection = True
                self.connection.shutdown(2)
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--repos", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--gated", action="append", default=[])
    p.add_argument("--token", default="hf_test")
    p.add_argument("--corrupt", action="append", default=[])
    p.add_argument("--break-after", type=int)
    p.add_argument("--break-mode", choices=["close", "stall"], default="close")
    p.add_argument("--huge", action="append", default=[])
    p.add_argument("--throttle", type=int, default=0)
    args = p.parse_args()
    Handler.state = State(args)
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    host, port = server.server_address[:2]
    print(f"hub: listening on http://{host}:{port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
