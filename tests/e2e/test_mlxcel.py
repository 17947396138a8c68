"""The mlxcel plugin end to end, against the protocol-faithful stand-in for
`mlxcel-server` (tests/stand-ins/mlxcel_server.py, written from the
reference, not from the plugin): which capabilities each engine version
turns on, which settings the schema shows and which it refuses (422), the
exact argv that reaches the engine, resolution against mlx-lm, drafter
fallbacks, and the OpenAI client streaming through Hangar.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import time
from pathlib import Path

import openai
import pytest

from conftest import REPO, Server, http

STAND_IN = REPO / "tests" / "stand-ins" / "mlxcel_server.py"
LLAMA = "tiny-llama"
CUDA = "linux/x86_64/cuda13,cpu"


class Host:
    """A `hangar serve` whose mlxcel-server is the stand-in at `version`."""

    def __init__(self, env, tmp: Path, version: str, platform: str = CUDA, engine_env: dict | None = None,
                 hangar_env: dict | None = None):
        tmp.mkdir(parents=True, exist_ok=True)
        wrapper = tmp / "mlxcel-server"
        exports = "".join(f"export {k}='{v}'\n" for k, v in (engine_env or {}).items())
        wrapper.write_text(
            f"#!/bin/sh\n{exports}MLXCEL_STANDIN_VERSION='{version}' exec '{env['python']}' '{STAND_IN}' \"$@\"\n"
        )
        wrapper.chmod(0o755)
        config = tmp / "config.toml"
        config.write_text(
            f'[plugins.mlxcel]\nprogram = "{wrapper}"\n[plugins.mlx-lm]\nprogram = "{env["python"]}"\n'
            'allow_programs = ["python3"]\n'
        )
        proc_env = dict(env["proc_env"], HANGAR_PLATFORM=platform, **(hangar_env or {}))
        args = [a for a in env["base_args"]]
        args[args.index("--config") + 1] = str(config)
        args[args.index("--state-dir") + 1] = str(tmp / "state")
        self.server = Server(f"hangar (mlxcel {version})", args, proc_env)
        self.url = self.server.url

    def get(self, path):
        return http(self.url + path)

    def put(self, path, body):
        return http(self.url + path, "PUT", body)

    def post(self, path, body=None):
        return http(self.url + path, "POST", body if body is not None else {})

    def argv(self, model: str = LLAMA) -> list[str]:
        status, sessions = self.get("/api/sessions")
        session = next(s for s in sessions["sessions"] if s["model"] == model)
        status, logs = self.get(f"/api/sessions/{session['id']}/logs")
        line = next(l for l in logs["lines"] if "mlxcel-server argv: " in l)
        return json.loads(line.split("mlxcel-server argv: ", 1)[1])

    def close(self):
        self.server.stop()


@pytest.fixture
def host(env, tmp_path):
    made = []

    def make(version: str, platform: str = CUDA, engine_env: dict | None = None,
             hangar_env: dict | None = None) -> Host:
        h = Host(env, tmp_path / f"v{len(made)}", version, platform, engine_env, hangar_env)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def plugin_row(h: Host, plugin: str) -> dict:
    status, report = h.get("/api/plugins")
    return next(p for p in report["plugins"] if p["id"] == plugin)


def without_endpoint(argv: list[str]) -> list[str]:
    """The argv with the model path and the port (which vary) masked."""
    out = list(argv)
    out[out.index("--port") + 1] = "PORT"
    out[out.index("--model") + 1] = "MODEL"
    return out


# (version, capabilities on, settings the schema shows, settings to store,
#  the exact argv they produce)
CASES = {
    "0.0.20": (
        # --cache-type-k/-v arrived in 0.0.26 (mlxcel's CHANGELOG).
        ["audio_input", "speculative", "tensor_parallel"],
        {"tensor_parallel_size": 1, "context_length": 2048},
        # -c is split across the slots: 1 by default before 0.4.0.
        ["--tp-size", "1", "-c", "2048", "--parallel", "1"],
    ),
    "0.0.26": (
        ["apc", "audio_input", "distributed_pipeline", "kv_cache_quantization", "kv_cache_turbo",
         "paged_attention", "prompt_cache", "reasoning_budget", "speculative", "tensor_parallel",
         "zero_config_pipeline"],
        {"kv_cache_type": "turbo4", "kv_bits": 4, "decode_storage": "paged", "prompt_cache": True,
         "apc": True, "reasoning_budget": 256},
        # 4 KV bits only with the TurboQuant scheme.
        ["--cache-type-k", "turbo4", "--cache-type-v", "turbo4", "--kv-bits", "4", "--kv-quant-scheme", "turboquant",
         "--decode-storage-backend", "paged", "--prompt-cache-enabled=true", "--apc-enabled=true",
         "--reasoning-budget=256"],
    ),
    "0.4.2": (
        ["apc", "audio_input", "distributed_pipeline", "kv_cache_budget", "kv_cache_quantization",
         "kv_cache_turbo", "paged_attention", "prompt_cache", "reasoning_budget", "speculative",
         "speculative_dflash", "speculative_mtp", "split_prefill_decode", "tensor_parallel",
         "zero_config_pipeline"],
        {"kv_cache_budget": "auto", "parallel": 2, "max_tokens": 32},
        ["-n", "32", "--kv-cache-budget", "auto", "--parallel", "2"],
    ),
    # A development build: newer than the version table knows, and semver
    # keeps a pre-release out of every `>=` range, so by its version every
    # capability would be off. Its --dump-flag-surface says what it has:
    # every capability with options of its own is on, --offline is passed,
    # and off is spelt --no-prompt-cache, as this build parses.
    "0.8.0-dev.3": (
        ["apc", "distributed_pipeline", "kv_cache_budget", "kv_cache_quantization", "kv_cache_turbo",
         "offline", "paged_attention", "prompt_cache", "reasoning_budget", "speculative",
         "speculative_dflash", "speculative_mtp", "tensor_parallel", "zero_config_pipeline"],
        {"prompt_cache": False, "kv_cache_budget": "none"},
        ["--offline", "--no-prompt-cache", "--kv-cache-budget", "none"],
    ),
    "nightly-20261130": (
        [],
        {"context_length": 1024},
        # An unknown version is planned as the newest: 4 slots of 1024.
        ["-c", "4096", "--parallel", "4"],
    ),
}


@pytest.mark.parametrize("version", list(CASES))
def test_versions_gate_capabilities_schema_settings_and_argv(host, version):
    capabilities, settings, flags = CASES[version]
    h = host(version)

    row = plugin_row(h, "mlxcel")
    assert row["status"] == "ready", row
    assert sorted(row["capabilities_on"]) == capabilities, row
    if version.startswith("nightly"):
        assert row["engine_version"] == "unknown"
        assert "not semver" in row["detail"], row

    status, schema = h.get(f"/api/models/{LLAMA}/settings/schema")
    assert status == 200 and schema["plugin"] == "mlxcel", schema
    shown = {s["name"] for s in schema["settings"]}
    hidden = {s["name"]: s["reason"] for s in schema["unavailable"]}
    assert "context_length" in shown and "max_tokens" in shown
    assert ("kv_cache_type" in shown) == ("kv_cache_quantization" in capabilities)
    assert ("decode_storage" in shown) == ("paged_attention" in capabilities)
    assert ("kv_cache_budget" in shown) == ("kv_cache_budget" in capabilities)
    kv = next((s for s in schema["settings"] if s["name"] == "kv_cache_type"), None)
    if kv:
        assert ("turbo4" in kv["values"]) == ("kv_cache_turbo" in capabilities), kv
    if "paged_attention" not in capabilities:
        found = version if not version.startswith("nightly") else "an unknown version"
        assert hidden["decode_storage"] == (
            f"plugin 'mlxcel' needs mlxcel-server >=0.0.21 for paged_attention; found {found}"
        )

    status, body = h.put(f"/api/models/{LLAMA}/settings", settings)
    assert status == 200, body
    status, body = h.post(f"/api/models/{LLAMA}/load")
    assert status == 200, body
    assert without_endpoint(h.argv()) == [
        "--model", "MODEL", "--alias", LLAMA, "--host", "127.0.0.1", "--port", "PORT", *flags,
    ]


def test_settings_the_engine_lacks_are_refused_with_422(host):
    h = host("0.0.20")
    status, body = h.put(f"/api/models/{LLAMA}/settings", {"decode_storage": "paged", "kv_cache_type": "turbo4"})
    assert status == 422, body
    message = body["error"]["message"]
    assert "setting 'decode_storage' is unavailable: plugin 'mlxcel' needs mlxcel-server >=0.0.21 for paged_attention; found 0.0.20" in message
    # --cache-type-* arrived in 0.0.26 (mlxcel's CHANGELOG): the setting as a whole is gated.
    assert "setting 'kv_cache_type' is unavailable: plugin 'mlxcel' needs mlxcel-server >=0.0.26 for kv_cache_quantization; found 0.0.20" in message, message
    status, body = h.put(f"/api/models/{LLAMA}/settings", {"no_such_setting": 1})
    assert status == 422 and "has no setting 'no_such_setting'" in body["error"]["message"], body
    status, body = h.put(f"/api/models/{LLAMA}/settings", {"parallel": "four"})
    assert status == 422 and "must be a whole number" in body["error"]["message"], body
    status, body = h.put("/api/settings", {"engines": {"mlxcel": {"reasoning_budget": 10}}})
    assert status == 422 and "reasoning_budget" in body["error"]["message"], body
    # Nothing was stored by the refused writes.
    status, body = h.get(f"/api/models/{LLAMA}/settings")
    assert body["stored"] == {}, body

    # A request field whose capability is off is refused too, before loading.
    client = openai.OpenAI(base_url=h.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.UnprocessableEntityError) as e:
        client.chat.completions.create(model=LLAMA, messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=2, extra_body={"thinking_budget_tokens": 64})
    assert "reasoning_budget" in e.value.message and "found 0.0.20" in e.value.message


def test_app_settings_layers_and_persistence(host, env):
    h = host("0.4.2")
    status, body = h.put("/api/settings", {
        "defaults": {"max_tokens": 24, "temperature": 0.5},
        "default_engines": {"mlx": "mlxcel"},
        "engines": {"mlxcel": {"parallel": 3}},
    })
    assert status == 200, body
    status, body = h.put(f"/api/models/{LLAMA}/settings", {"parallel": 1})
    assert status == 200, body
    effective = body["effective"]
    assert effective["parallel"] == {"value": 1, "source": "model"}
    assert effective["max_tokens"] == {"value": 24, "source": "app_default"}
    assert "temperature" not in effective  # mlxcel declares no temperature setting
    status, body = h.put("/api/settings", {"defaults": {"temperature": 7}})
    assert status == 422 and "temperature" in body["error"]["message"], body
    status, body = h.put("/api/settings", {"default_engines": {"mlx": "nope"}})
    assert status == 422, body
    settings_file = Path(h.server.args[h.server.args.index("--config") + 1]).with_name("settings.toml")
    text = settings_file.read_text()
    assert "[models.tiny-llama]" in text and "parallel = 1" in text, text
    h.post(f"/api/models/{LLAMA}/load")
    assert without_endpoint(h.argv())[8:] == ["-n", "24", "--parallel", "1"]


def test_a_failed_load_falls_back_to_the_next_engine_within_seconds(host):
    # mlxcel-server does not exit when its load fails: it opens its port
    # (after the load, warm-up being on) and answers 503 for good. That 503
    # is a failed load, so the next engine starts at once, not after mlxcel's
    # 300 s start timeout.
    h = host("0.4.2", engine_env={"MLXCEL_STANDIN_FAIL_LOAD": "unsupported model_type 'llama'"})
    started = time.monotonic()
    status, body = h.post(f"/api/models/{LLAMA}/load")
    took = time.monotonic() - started
    print(f"\nmlxcel failed load -> mlx-lm serving in {took:.2f} s")
    assert status == 200, body
    # The next survivor: native-mlx where it was built, else mlx-lm.
    assert body["session"]["plugin"] in ("native-mlx", "mlx-lm"), body
    assert took < 20, took
    status, body = h.get("/api/sessions")
    session = next(s for s in body["sessions"] if s["model"] == LLAMA)
    assert "mlxcel" in json.dumps(session) and "503" in json.dumps(session), session


def test_the_hosts_llama_and_mlxcel_environment_does_not_reach_the_engine(host):
    # mlxcel-server reads LLAMA_API_KEY (an API key every route then
    # demands) and LLAMA_ARG_* (its flags) from its environment.
    h = host("0.4.2", hangar_env={"LLAMA_API_KEY": "leaked", "LLAMA_ARG_N_PARALLEL": "0"})
    status, body = h.post(f"/api/models/{LLAMA}/load")
    assert status == 200 and body["session"]["plugin"] == "mlxcel", body
    status, body = h.post("/v1/chat/completions", {
        "model": LLAMA, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert status == 200, body


def test_mlxcel_wins_over_mlx_lm_where_it_runs(host):
    h = host("0.4.2")
    status, body = h.get(f"/api/resolve?model={LLAMA}")
    trace = {t["plugin"]: t for t in body["resolution"]["trace"]}
    assert body["resolution"]["chosen"] == "mlxcel", body
    assert trace["mlx-lm"]["verdict"] == "outranked", trace

    cpu = host("0.4.2", platform="linux/x86_64/cpu")
    status, body = cpu.get(f"/api/resolve?model={LLAMA}")
    resolution = body["resolution"]
    # The next engine by priority serves: native-mlx where it is built, else mlx-lm.
    assert resolution["chosen"] in ("native-mlx", "mlx-lm"), resolution
    mlxcel = next(t for t in resolution["trace"] if t["plugin"] == "mlxcel")
    assert mlxcel["verdict"] == "rejected"
    assert "not on this machine (linux/x86_64/cpu)" in mlxcel["reason"], mlxcel


def fake_model(folder: Path, config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    header = b"{}"
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    return folder


def test_drafters_are_detected_and_incompatible_pairs_fall_back(host, env):
    models, drafters = env["models"], env["root"] / "drafters"
    mtp = fake_model(drafters / "gemma-mtp", {"model_type": "gemma4_assistant", "vocab_size": 512})
    dflash = fake_model(drafters / "qwen-dflash", {"vocab_size": 512})
    gemma = fake_model(models / "fake-gemma4", {"model_type": "gemma4", "vocab_size": 512})
    try:
        h = host("0.4.2")
        # An MTP drafter with a Gemma 4 target: detected from its config.json
        # (and left to mlxcel's own detection, with its own block size).
        assert h.put("/api/models/fake-gemma4/settings", {"draft_model": str(mtp)})[0] == 200
        assert h.post("/api/models/fake-gemma4/load")[0] == 200
        assert without_endpoint(h.argv("fake-gemma4"))[8:] == [
            "--model-draft", str(mtp)]
        # A DFlash drafter with a Llama target: falls back, and says why.
        assert h.put(f"/api/models/{LLAMA}/settings", {"draft_model": str(dflash)})[0] == 200
        assert h.post(f"/api/models/{LLAMA}/load")[0] == 200
        assert without_endpoint(h.argv())[8:] == []
        session = next(s for s in h.get("/api/sessions")[1]["sessions"] if s["model"] == LLAMA)
        assert any("decoding normally" in n and "Qwen 3.5" in n for n in session["notes"]), session

        # An engine without MTP (0.0.26): the MTP drafter falls back too.
        old = host("0.0.26")
        assert old.put("/api/models/fake-gemma4/settings", {"draft_model": str(mtp)})[0] == 200
        assert old.post("/api/models/fake-gemma4/load")[0] == 200
        session = next(s for s in old.get("/api/sessions")[1]["sessions"] if s["model"] == "fake-gemma4")
        assert any("speculative_mtp" in n and "found 0.0.26" in n for n in session["notes"]), session
        # A hub name is not a drafter.
        status, body = old.put(f"/api/models/{LLAMA}/settings", {"draft_model": "Qwen/Qwen3.5-0.8B"})
        assert status == 422 and "hub names are not fetched" in body["error"]["message"], body
    finally:
        shutil.rmtree(gemma)


def test_openai_client_through_hangar_to_the_stand_in(host):
    h = host("0.4.2")
    client = openai.OpenAI(base_url=h.url + "/v1", api_key="x", max_retries=0)
    r = client.chat.completions.create(model=LLAMA, messages=[{"role": "user", "content": "one two"}], max_tokens=3)
    assert r.model == LLAMA and r.choices[0].message.content == "tok0 tok1 tok2 "
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"
    chunks = list(client.chat.completions.create(
        model=LLAMA, messages=[{"role": "user", "content": "one two"}], max_tokens=4, stream=True,
        stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "tok0 tok1 tok2 tok3 "
    assert all(c.model == LLAMA for c in chunks)
    assert chunks[-1].usage.completion_tokens == 4
    r = client.completions.create(model=LLAMA, prompt="a b c", max_tokens=2)
    assert r.choices[0].text == "tok0 tok1 "
    # A reasoning budget per request reaches an engine that has it.
    r = client.chat.completions.create(model=LLAMA, messages=[{"role": "user", "content": "x"}], max_tokens=1,
                                       extra_body={"thinking_budget_tokens": 64})
    assert r.usage.completion_tokens == 1
