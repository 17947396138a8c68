"""`GET /openapi.json` and schemathesis: the host's own OpenAPI 3.1 document
drives property-based requests at a host serving a real model (mlx-lm,
tiny-llama), and every answer must conform to the document (status, content
type, body schema, server-sent events included) with no 5xx.

The run is bounded for 2 cores: a fixed seed, 10 examples per operation,
one worker, and token counts lowered by schemathesis_hooks.py. Left out is
`positive_data_acceptance`: some valid values depend on the running host
(a model's settings are named by its plugin), so the document cannot promise
that every schema-valid body is accepted. Left out too are the live streams
(`/api/events/stream`, `/api/sessions/{id}/logs/stream`), which follow the
host until it stops and so never finish a response, and Ollama's verbs that
Hangar answers 501 by design (`/ollama/api/pull` and the like; the hooks
keep the served model from `DELETE /api/models/{id}` and
`/ollama/api/delete`). The
embedding routes are fuzzed against real embedders in
test_embeddings_native.py; here their requests name chat models or none.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

from conftest import Server, http
from test_pull import Hub

HERE = os.path.dirname(os.path.abspath(__file__))


def test_the_document_covers_the_routes(server):
    status, doc = http(server.url + "/openapi.json")
    assert status == 200 and doc["openapi"] == "3.1.0", doc
    assert set(doc["components"]["securitySchemes"]) == {"bearer", "x-api-key"}, doc["components"]
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses",
                 "/v1/responses/{id}", "/v1/models", "/health",
                 "/api/models/{id}/settings/schema", "/metrics", "/openapi.json",
                 "/ollama/api/chat", "/ollama/api/generate", "/ollama/api/tags"):
        assert path in doc["paths"], (path, sorted(doc["paths"]))
    assert "MessagesRequest" in doc["components"]["schemas"]
    assert "ResponsesRequest" in doc["components"]["schemas"]
    assert set(doc["paths"]["/v1/responses/{id}"]) == {"get", "delete"}, doc["paths"]["/v1/responses/{id}"]


def test_schemathesis_finds_no_5xx_and_no_mismatch(env, tmp_path):
    # A host of its own: the fuzzer writes settings.
    config = tmp_path / "config.toml"
    config.write_text(env["config"].read_text())
    (tmp_path / "settings.toml").write_text('[default_engines]\nmlx = "mlx-lm"\n')
    (tmp_path / "state").mkdir()
    # With a key, so that schemathesis also checks that every route the
    # document says needs one refuses a request without it.
    args = list(env["base_args"]) + ["--api-key", "fuzz-key"]
    # A model dir of its own too: the fuzzer calls DELETE /api/models/{id}
    # with the ids it reads from the listings.
    shutil.copytree(env["models"], tmp_path / "models", symlinks=True)
    args[args.index("--model-dir") + 1] = str(tmp_path / "models")
    args[args.index("--config") + 1] = str(config)
    args[args.index("--state-dir") + 1] = str(tmp_path / "state")
    # The pull routes ask a hub: the stand-in, with no repositories, so a
    # fuzzed pull is a quick 404 and nothing is fetched from anywhere.
    (tmp_path / "hub-repos").mkdir()
    hub = Hub(tmp_path / "hub-repos")
    proc_env = dict(env["proc_env"], HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(tmp_path / "hf-cache"))
    proc_env.pop("HF_TOKEN", None)
    srv = Server("hangar (schemathesis)", args, proc_env)
    try:
        schemathesis = os.path.join(os.path.dirname(sys.executable), "schemathesis")
        run = subprocess.run(
            [
                schemathesis, "run", srv.url + "/openapi.json", "--header", "Authorization: Bearer fuzz-key",
                "--checks", "all", "--exclude-checks", "positive_data_acceptance",
                "--max-examples", "10", "--workers", "1", "--seed", "1",
                # The live streams never end by design (they follow the host);
                # Ollama's verbs that Hangar lacks are 501s by design.
                "--exclude-path-regex",
                r"/stream$|^/ollama/api/(pull|push|create|copy|blobs/\{digest\})$",
                "--request-timeout", "60", "--generation-database", "none", "--no-color",
                "--report", "junit", "--report-dir", str(tmp_path / "report"),
            ],
            cwd=tmp_path,  # schemathesis keeps a cache in its working dir
            env={**os.environ, "PYTHONPATH": HERE, "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
                 "HANGAR_FUZZ_MODEL": "tiny-llama"},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600,
        )
        assert run.returncode == 0, f"schemathesis found problems:\n{run.stdout[-12000:]}"
        assert "passed" in run.stdout, run.stdout[-3000:]
        # The hooks keep the model the generation routes are pointed at.
        assert (tmp_path / "models" / "tiny-llama").is_dir()
    finally:
        problems = srv.stop()
        hub.stop()
    assert not problems, problems
    assert not (tmp_path / "hf-cache").exists()


def test_what_schemathesis_found_stays_fixed(server):
    """Requests that each killed mlx-lm's generation thread (a 502 and a
    restart) before the host checked them: now a 400 naming the field, or
    served; the engine serves on without a restart."""
    chat = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    before = len(http(server.url + "/api/events")[1]["events"])  # other tests kill engines on purpose
    status, body = http(server.url + "/v1/completions", "POST", {"model": "tiny-llama", "prompt": "", "max_tokens": 2})
    assert status == 400 and body["error"]["param"] == "prompt", body
    status, body = http(server.url + "/v1/completions", "POST", {"model": "tiny-llama", "prompt": [""], "max_tokens": 2})
    assert status == 400 and body["error"]["param"] == "prompt", body
    # A list of one prompt is that prompt; more, or token ids, need an
    # engine that takes lists (mlx_lm.server's thread died on any list).
    status, body = http(server.url + "/v1/completions", "POST", {"model": "tiny-llama", "prompt": ["hi"], "max_tokens": 2})
    assert status == 200 and len(body["choices"]) == 1, body
    for prompt, what in ((["a", "b"], "a list of 2 prompts"), ([1, 2], "a list of token ids")):
        status, body = http(server.url + "/v1/completions", "POST", {"model": "tiny-llama", "prompt": prompt, "max_tokens": 2})
        assert status == 422 and what in body["error"]["message"] and "prompt_lists" in body["error"]["message"], body
    status, body = http(server.url + "/v1/chat/completions", "POST", {**chat, "top_k": 512, "temperature": 0.5})
    assert status == 400 and body["error"]["param"] == "top_k" and "512 tokens" in body["error"]["message"], body
    status, body = http(server.url + "/v1/messages", "POST", {**chat, "top_k": 10**9, "temperature": 0.5})
    assert status == 400 and "'top_k'" in body["error"]["message"], body
    status, body = http(server.url + "/v1/chat/completions", "POST", {**chat, "seed": -(2**63) + 1})
    assert status == 200, body
    status, body = http(server.url + "/v1/chat/completions", "POST", {**chat, "top_k": 511, "temperature": 0.5})
    assert status == 200, body
    status, events = http(server.url + "/api/events")
    failed = [e for e in events["events"][before:] if e["kind"] in ("failed", "crashed") and e["model"] == "tiny-llama"]
    assert not failed, failed
