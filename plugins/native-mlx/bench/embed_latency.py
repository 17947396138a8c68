#!/usr/bin/env python3
"""The host's added latency on a one-input embeddings request: `hangar
serve` with native-mlx on MODEL_DIR, one client on one kept-alive
connection sending `POST /v1/embeddings` with one input of TOKENS token ids
(the same work as `native-mlx-bench --embed 1`), RUNS timed requests after
a warm-up that loads the model.

    python embed_latency.py --hangar BIN --plugins-dir DIR MODEL_DIR [--tokens 64] [--runs 50]

Prints one JSON line: {"runs", "tokens", "median_ms", "min_ms", "max_ms",
"p90_ms"}; scripts/embed-bench.sh sets it beside the engine's own
ms/request to give what the host adds (HTTP, validation, admission, the
worker's IPC, JSON both ways).
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
from serving_bench import Server  # noqa: E402 (the same `hangar serve` runner)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("--hangar", required=True)
    ap.add_argument("--plugins-dir", required=True)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=50)
    args = ap.parse_args()
    vocab = json.loads((args.model / "config.json").read_text())["vocab_size"]
    with tempfile.TemporaryDirectory(prefix="hangar-embed-latency-") as root:
        models = os.path.join(root, "models")
        os.makedirs(models)
        os.makedirs(os.path.join(root, "state"))
        Path(root, "config.toml").write_text("")
        name = "bench-embedder"
        os.symlink(args.model.resolve(), os.path.join(models, name))
        env = {k: v for k, v in os.environ.items() if not k.startswith("HANGAR_")}
        env["HANGAR_LOG"] = "warn"
        srv = Server("hangar", [args.hangar, "serve", "--port", "0", "--model-dir", models,
                                "--plugins-dir", args.plugins_dir, "--config", os.path.join(root, "config.toml"),
                                "--state-dir", os.path.join(root, "state")], env)
        try:
            address = urlparse(srv.url)
            conn = http.client.HTTPConnection(address.hostname, address.port, timeout=300)

            def once(i: int) -> float:
                # Distinct ids away from the special ones, as native-mlx-bench makes them.
                ids = [5 + (j * 7919 + i * 104_729 + 13) % (vocab - 5) for j in range(args.tokens)]
                body = json.dumps({"model": name, "input": [ids]})
                start = time.perf_counter()
                conn.request("POST", "/v1/embeddings", body, {"content-type": "application/json"})
                response = conn.getresponse()
                data = response.read()
                took = time.perf_counter() - start
                if response.status != 200:
                    sys.exit(f"HTTP {response.status}: {data[:500]!r}")
                return took * 1e3

            for i in range(5):  # loads the model, warms the engine
                once(i)
            ms = sorted(once(i) for i in range(args.runs))
        finally:
            srv.stop()
    print(json.dumps({"runs": args.runs, "tokens": args.tokens, "median_ms": statistics.median(ms),
                      "min_ms": ms[0], "max_ms": ms[-1], "p90_ms": ms[int(len(ms) * 0.9)]}))


if __name__ == "__main__":
    main()
