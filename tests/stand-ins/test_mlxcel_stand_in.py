"""The stand-in itself: it must refuse exactly the flags the reference says
each version lacks (or it could not catch a plugin that passes them), and
speak the protocol the reference describes."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
import urllib.error
import urllib.request
from pathlib import Path

import pytest

STAND_IN = Path(__file__).with_name("mlxcel_server.py")


def run(version: str, *args: str, **env) -> subprocess.CompletedProcess:
    env = dict(os.environ, MLXCEL_STANDIN_VERSION=version, **env)
    return subprocess.run([sys.executable, str(STAND_IN), *args], env=env, capture_output=True, text=True,
                          timeout=20)


@pytest.fixture
def model(tmp_path) -> str:
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    return str(folder)


@pytest.mark.parametrize("version", ["0.0.1", "0.0.20", "0.4.2", "1.2.3-rc.1", "nightly-abc"])
@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_is_printed_like_clap(version, flag):
    r = run(version, flag)
    assert (r.returncode, r.stdout, r.stderr) == (0, f"mlxcel-server {version}\n", "")


def test_default_version_is_0_4_2():
    env = {k: v for k, v in os.environ.items() if k != "MLXCEL_STANDIN_VERSION"}
    r = subprocess.run([sys.executable, str(STAND_IN), "-V"], env=env, capture_output=True, text=True)
    assert r.stdout == "mlxcel-server 0.4.2\n"


# (version, flags, accepted) from the reference's table: basic flags always,
# each capability's flags from its first version, only basic ones for an
# unparseable version, and a pre-release before its release.
MATRIX = [
    ("0.0.1", ["--model-draft", "{model}", "--draft", "4"], True),
    ("0.0.1", ["--draft-model", "{model}", "--draft-max", "4"], True),
    ("0.0.25", ["--cache-type-k", "int8"], False),
    ("0.0.26", ["--cache-type-k", "int8", "--cache-type-v", "fp16"], True),
    ("0.0.19", ["--tp-size", "2"], False),
    ("0.0.20", ["--tp-size", "2"], True),
    ("0.0.20", ["--decode-storage-backend", "paged"], False),
    ("0.0.20", ["--prompt-cache-enabled"], False),
    ("0.0.21", ["--decode-storage-backend", "paged"], True),
    ("0.0.21", ["--decode-storage-backend", "sparse"], False),
    ("0.0.21", ["--node-id", "0"], False),
    ("0.0.22", ["--node-id", "0", "--node-role", "stage", "--pp-layers", "0-7"], True),
    ("0.0.22", ["--node-role", "prefill"], False),
    ("0.0.23", ["--pp-auto", "2"], False),
    ("0.0.24", ["--pp-auto", "2", "--cluster-discovery", "mdns", "--cluster-peers", "a:1,b:2"], True),
    ("0.0.24", ["--cluster-discovery", "dns"], False),
    ("0.0.24", ["--reasoning-budget", "0"], False),
    ("0.0.25", ["--prompt-cache-enabled", "--prompt-cache-capacity-bytes", "1024", "--prompt-cache-ttl", "60"], True),
    ("0.0.25", ["--no-prompt-cache"], False),
    ("0.4.0", ["--no-prompt-cache"], True),
    ("0.0.25", ["--prompt-cache-enabled=false"], True),
    ("0.0.25", ["--prompt-cache-enabled", "false"], False),
    ("0.0.25", ["--reasoning-budget=-1"], True),
    ("0.4.2", ["--reasoning-budget", "-1"], False),
    ("0.7.0", ["--reasoning-budget", "-1"], True),
    ("0.0.25", ["--reasoning-budget", "-2"], False),
    ("0.0.25", ["--cache-type-k", "turbo4"], False),
    ("0.0.25", ["--apc-enabled"], False),
    ("0.0.25-rc.1", ["--prompt-cache-enabled"], False),
    ("0.0.26", ["--cache-type-k", "turbo4", "--cache-type-v", "turbo4"], True),
    ("0.0.26", ["--kv-bits", "4", "--kv-quant-scheme", "turboquant", "--apc-enabled", "--apc-block-size", "16"],
     True),
    ("0.0.25", ["--kv-bits", "8"], False),
    ("0.0.26", ["--kv-bits", "eight"], False),
    ("0.4.2", ["--offline"], False),
    ("0.7.0", ["--offline"], True),
    ("0.0.26", ["--apc-enabled=false"], True),
    ("0.0.26", ["--apc-enabled=no"], False),
    ("0.0.26", ["--draft-kind", "mtp"], False),
    ("0.0.27", ["--draft-kind", "mtp", "--draft-block-size", "4"], True),
    ("0.0.27", ["--draft-kind", "eagle"], False),
    ("0.0.27", ["--kv-cache-budget", "auto"], False),
    ("0.1.9", ["--node-role", "decode"], False),
    ("0.2.0", ["--kv-cache-budget", "auto"], True),
    ("0.2.0", ["--kv-cache-budget", "8589934592"], True),
    ("0.2.0", ["--kv-cache-budget", "none"], True),
    ("0.2.0", ["--kv-cache-budget", "8G"], False),
    ("0.2.0", ["--node-role", "router"], True),
    ("0.4.2", ["--model-draft", "{model}", "--draft-kind", "dflash", "--cache-type-k", "turbo4",
               "--decode-storage-backend", "dense", "--tp-size", "1", "--prompt-cache-enabled",
               "--reasoning-budget", "128", "--apc-enabled", "--kv-cache-budget", "auto", "--node-role",
               "prefill", "--pp-auto", "2"], True),
    # A free string for clap: q8_0 is refused at start-up (exit 1), not here.
    ("0.4.2", ["--cache-type-k", "q8_0"], True),
    ("0.4.2", ["--no-such-flag"], False),
    ("0.4.2", ["--metrics=true"], False),
    ("0.4.2", ["--port", "http"], False),
    ("0.4.2", ["--port", "70000"], False),
    ("0.4.2", ["--parallel", "0"], False),
    ("0.4.2", ["--parallel", "2", "--parallel", "3"], False),
    ("0.4.2", ["-a", "x", "--alias", "y"], False),
    ("0.4.2", ["--ctx-size"], False),
    ("0.4.2", ["--ctx-size", "--metrics"], False),
    ("0.4.2", ["-c", "-5"], False),
    ("0.4.2", ["-n=-1", "-c4096", "-a=x", "--port=0", "--host=127.0.0.1", "--timeout", "600",
               "--api-key", "k", "--chat-template", "chatml", "--chat-template-kwargs", "{}",
               "--no-warmup", "--metrics", "--props"], True),
    ("0.4.2", ["stray"], False),
    ("nightly-abc", ["-c", "128", "-n", "8", "--parallel", "2", "--no-warmup"], True),
    ("nightly-abc", ["--cache-type-k", "int8"], False),
    ("nightly-abc", ["--draft", "4"], False),
]


@pytest.fixture(scope="module")
def matrix_runs(tmp_path_factory):
    """Every MATRIX case, run concurrently (keeps the suite fast)."""
    folder = tmp_path_factory.mktemp("matrix")
    (folder / "config.json").write_text('{"model_type": "llama"}')

    def one(case):
        version, flags, _ = case
        flags = [f.replace("{model}", str(folder)) for f in flags]
        # `--help` after the flags: clap parses left to right, so a run that
        # parses every flag prints help and exits 0 without serving.
        return run(version, "-m", str(folder), *flags, "--help")

    with ThreadPoolExecutor(8) as pool:
        return dict(zip(range(len(MATRIX)), pool.map(one, MATRIX)))


@pytest.mark.parametrize("case", range(len(MATRIX)), ids=[f"{v}:{' '.join(f)}" for v, f, _ in MATRIX])
def test_flags_are_accepted_only_from_their_version(matrix_runs, case):
    version, flags, accepted = MATRIX[case]
    r = matrix_runs[case]
    if accepted:
        assert r.returncode == 0 and r.stdout.startswith("Lablup"), r.stderr
    else:
        assert r.returncode == 2, (r.returncode, r.stderr)
        assert r.stderr.startswith("error: ") and "\nUsage: mlxcel-server [OPTIONS]\n" in r.stderr, r.stderr


def test_clap_error_messages():
    r = run("0.0.20", "--decode-storage-backend", "paged")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("error: unexpected argument '--decode-storage-backend' found\n")
    r = run("0.4.2", "--foo=1")
    assert r.stderr.startswith("error: unexpected argument '--foo' found\n")
    r = run("0.4.2", "--port")
    assert r.stderr.startswith("error: a value is required for '--port <PORT>' but none was supplied\n")
    r = run("0.4.2", "--draft-kind", "x")
    assert r.stderr.startswith("error: invalid value 'x' for '--draft-kind <DRAFT_KIND>'\n")
    assert "[possible values: dflash, mtp]" in r.stderr


def test_help_lists_the_flags_of_its_version():
    old, new, odd = (run(v, "--help").stdout for v in ("0.0.20", "0.4.2", "nightly-abc"))
    for flag in ("--tp-size", "--draft-model", "--ctx-size"):
        assert flag in old
    for flag in ("--decode-storage-backend", "--prompt-cache-enabled", "--draft-kind", "--kv-cache-budget",
                 "--cache-type-k", "--kv-quant-scheme"):
        assert flag not in old and flag in new
    assert "[default: 1]" in old and "[default: 4]" in new
    assert "--model" in odd and "--draft" not in odd and "--cache-type-k" not in odd


def test_the_flag_surface_is_dumped_from_0_7_0_and_only_as_the_first_argument():
    r = run("0.7.0", "--dump-flag-surface")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema_version"] == 1 and doc["binary"] == "mlxcel-server"
    longs = [a["long"] for a in doc["args"]]
    assert longs == sorted(longs)
    by_long = {a["long"]: a for a in doc["args"]}
    assert by_long["ctx-size"]["short"] == "c" and by_long["ctx-size"]["takes_value"]
    assert by_long["model-draft"]["long_aliases"] == ["draft-model"]
    assert not by_long["offline"]["takes_value"] and "help" in by_long and "version" in by_long
    # Not the first argument, or an older build: clap's unknown argument.
    for version, args in (("0.7.0", ("--port", "1", "--dump-flag-surface")), ("0.4.2", ("--dump-flag-surface",))):
        r = run(version, *args)
        assert r.returncode == 2 and "unexpected argument '--dump-flag-surface'" in r.stderr, r.stderr


def test_a_failed_load_exits_1_after_recording_argv(tmp_path):
    argv_file = tmp_path / "argv.json"
    args = ["-m", str(tmp_path / "missing"), "--port", "0"]
    r = run("0.4.2", *args, MLXCEL_STANDIN_ARGV_FILE=str(argv_file))
    assert r.returncode == 1 and "failed to load model" in r.stderr
    assert f"mlxcel-server argv: {json.dumps(args)}" in r.stderr.splitlines()
    assert json.loads(argv_file.read_text()) == args
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text('{"model_type": ')
    assert run("0.4.2", "-m", str(tmp_path / "bad"), "--port", "0").returncode == 1


def test_distributed_config_is_read_and_printed(model, tmp_path):
    config = tmp_path / "cluster.toml"
    config.write_text('[[nodes]]\nid = 0\nhost = "a"\nlayers = "0-7"\n')
    r = run("0.0.22", "-m", model, "--port", "0", "--distributed-config", str(tmp_path / "nope.toml"))
    assert r.returncode == 1 and "distributed config" in r.stderr
    (tmp_path / "bad.toml").write_text("[[nodes]\n")
    r = run("0.0.22", "-m", model, "--port", "0", "--distributed-config", str(tmp_path / "bad.toml"))
    assert r.returncode == 1
    with Served("0.0.22", "-m", model, "--distributed-config", str(config)) as s:
        line = next(l for l in s.stderr_lines if l.startswith("mlxcel-server distributed-config: "))
        assert json.loads(line.split(": ", 1)[1]) == {"nodes": [{"id": 0, "host": "a", "layers": "0-7"}]}


class Served:
    """The stand-in serving on a free port."""

    def __init__(self, version: str, *args: str, load_ms: int = 0, token_ms: int = 0, **extra_env):
        env = dict(os.environ, MLXCEL_STANDIN_VERSION=version, MLXCEL_STANDIN_LOAD_MS=str(load_ms),
                   MLXCEL_STANDIN_TOKEN_MS=str(token_ms), **extra_env)
        self.proc = subprocess.Popen([sys.executable, str(STAND_IN), "--port", "0", *args], env=env,
                                     stderr=subprocess.PIPE, text=True)
        self.stderr_lines = []
        for line in self.proc.stderr:
            self.stderr_lines.append(line.rstrip("\n"))
            if " listening on " in line:
                self.url = "http://127.0.0.1:" + line.rsplit(":", 1)[1].strip()
                break
        else:
            raise AssertionError(f"stand-in did not start: {self.stderr_lines}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(5)
        self.proc.stderr.close()

    def request(self, path, body=None, headers=None, raw=False):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, headers={
            "Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                status, text = r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode()
        return status, (text if raw else json.loads(text))


def test_health_goes_from_loading_to_ok_and_sigterm_exits_0(model):
    # --no-warmup: the port opens before the model is loaded.
    with Served("0.4.2", "-m", model, "--no-warmup", load_ms=400) as s:
        assert s.request("/health") == (503, {"status": "loading model"})
        assert s.request("/v1/models")[0] == 503
        time.sleep(0.5)
        assert s.request("/health") == (200, {"status": "ok"})
        assert s.request("/v1/health")[0] == 404
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(2) == 0


def test_with_warmup_the_port_opens_after_the_load(model):
    started = time.monotonic()
    with Served("0.4.2", "-m", model, load_ms=400) as s:
        assert time.monotonic() - started >= 0.4
        assert s.request("/health") == (200, {"status": "ok"})


def test_a_failed_load_stays_up_answering_503_and_says_so(model):
    with Served("0.4.2", "-m", model, MLXCEL_STANDIN_FAIL_LOAD="unsupported model_type 'x'") as s:
        assert "Failed to load model: unsupported model_type 'x'" in s.stderr_lines
        assert s.request("/health") == (503, {"status": "loading model"})
        time.sleep(0.3)
        assert s.proc.poll() is None and s.request("/health")[0] == 503
    with Served("0.7.0", "-m", model, MLXCEL_STANDIN_FAIL_LOAD="bad weights") as s:
        status, body = s.request("/health")
        assert status == 503 and body["error"]["message"] == "Loading model", body


def test_the_remote_pipeline_refuses_layers_drafters_and_tensor_parallelism(model, tmp_path):
    remote = tmp_path / "remote.toml"
    remote.write_text("[cluster]\nname = 'x'\npipeline_parallel_size = 2\n")
    single = tmp_path / "single.toml"
    single.write_text("[cluster]\nname = 'x'\npipeline_parallel_size = 1\n")
    base = ["-m", model, "--port", "0", "--node-id", "coordinator"]
    for extra, message in [
        (["--pp-layers", "0-7"], "remove --pp-layers"),
        (["--model-draft", model], "does not support speculative decoding"),
        (["--tp-size", "2"], "does not support tensor parallelism"),
    ]:
        r = run("0.4.2", *base, "--distributed-config", str(remote), *extra)
        assert r.returncode == 1 and message in r.stderr, r.stderr
    r = run("0.4.2", "-m", model, "--port", "0", "--distributed-config", str(remote))
    assert r.returncode == 1 and "requires --node-id" in r.stderr, r.stderr
    # One stage is no remote pipeline: nothing is refused.
    with Served("0.4.2", *base[4:], "-m", model, "--distributed-config", str(single), "--tp-size", "2"):
        pass


@pytest.mark.parametrize("flags, refused", [
    (["--kv-bits", "8"], None),
    (["--kv-bits", "8", "--kv-quant-scheme", "uniform"], None),
    (["--kv-bits", "4", "--kv-quant-scheme", "turboquant"], None),
    (["--kv-quant-scheme", "turboquant"], None),
    (["--kv-bits", "4"], "--kv-bits 4 not supported for --kv-quant-scheme uniform; expected 8"),
    (["--kv-bits", "8", "--kv-quant-scheme", "turboquant"], "expected 4"),
    (["--kv-bits", "6"], "--kv-bits 6 not supported"),
    (["--kv-quant-scheme", "fp8"], "unknown --kv-quant-scheme"),
    (["--cache-type-k", "turbo4", "--cache-type-v", "turbo4"], None),
    (["--cache-type-k", "int8"], "unsupported KV cache combination"),
    (["--cache-type-k", "q8_0", "--cache-type-v", "q8_0"], "--cache-type-k q8_0 is not a recognised KV cache type"),
])
def test_kv_quantization_is_checked_at_start_up(model, flags, refused):
    if refused is None:
        with Served("0.4.2", "-m", model, *flags):
            return
    r = run("0.4.2", "-m", model, "--port", "0", *flags)
    assert r.returncode == 1 and refused in r.stderr, r.stderr


def test_ctx_size_is_split_across_slots_and_512_per_slot_is_the_floor(model):
    r = run("0.4.2", "-m", model, "--port", "0", "-c", "2044", "--parallel", "4")
    assert r.returncode == 1 and "511 tokens per slot" in r.stderr, r.stderr
    with Served("0.4.2", "-m", model, "-c", "4096", "--parallel", "2", "--props") as s:
        assert s.request("/props")[1]["default_generation_settings"]["n_ctx"] == 2048
    # Before 0.0.30 every slot had the whole --ctx-size.
    with Served("0.0.29", "-m", model, "-c", "256", "--parallel", "2", "--props") as s:
        assert s.request("/props")[1]["default_generation_settings"]["n_ctx"] == 256


def test_health_says_no_slot_available_when_full(model):
    import threading
    with Served("0.4.2", "-m", model, "--parallel", "1", token_ms=100) as s:
        t = threading.Thread(target=s.request, args=("/v1/completions", {"prompt": "x", "max_tokens": 5}))
        t.start()
        time.sleep(0.25)
        assert s.request("/health") == (503, {"status": "no slot available"})
        t.join()
        assert s.request("/health") == (200, {"status": "ok"})
    # Since the llama-server b10621 alignment /health never reports load.
    with Served("0.7.0", "-m", model, "--parallel", "1", token_ms=100) as s:
        t = threading.Thread(target=s.request, args=("/v1/completions", {"prompt": "x", "max_tokens": 5}))
        t.start()
        time.sleep(0.25)
        assert s.request("/health") == (200, {"status": "ok"})
        t.join()


def test_streamed_and_plain_completions(model):
    with Served("0.4.2", "-m", model, "-a", "tiny", "-n", "3") as s:
        assert s.request("/v1/models")[1]["data"][0]["id"] == "tiny"
        status, text = s.request("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "one two three"}], "max_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True}}, raw=True)
        assert status == 200 and text.endswith("data: [DONE]\n\n")
        chunks = [json.loads(e[6:]) for e in text.split("\n\n") if e and e != "data: [DONE]"]
        assert all(c["object"] == "chat.completion.chunk" and c["model"] == "tiny" for c in chunks)
        assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) \
            == "tok0 tok1 tok2 tok3 "
        assert chunks[-2]["choices"][0]["finish_reason"] == "length"
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
            "prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
        status, body = s.request("/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "a"}]})
        assert status == 200 and body["model"] == "m" and body["choices"][0]["message"]["content"] == "tok0 tok1 tok2 "
        status, body = s.request("/completions", {"prompt": "a b", "max_tokens": 2})
        assert body["object"] == "text_completion" and body["choices"][0]["text"] == "tok0 tok1 "
        assert body["usage"]["prompt_tokens"] == 2
        status, text = s.request("/v1/completions", {"prompt": "a", "max_tokens": 1, "stream": True}, raw=True)
        assert '"object": "text_completion"' in text and text.endswith("data: [DONE]\n\n")
        status, body = s.request("/v1/nope")
        assert status == 404 and "message" in body["error"]


def test_api_key_and_thinking_budget_gate(model):
    with Served("0.0.24", "-m", model, "--api-key", "sekret") as s:
        chat = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
        assert s.request("/v1/chat/completions", chat)[0] == 401
        auth = {"Authorization": "Bearer sekret"}
        assert s.request("/v1/chat/completions", chat, auth)[0] == 200
        status, body = s.request("/v1/chat/completions", {**chat, "thinking_budget_tokens": 8}, auth)
        assert status == 400 and "thinking_budget_tokens" in body["error"]["message"]
        # The slot is released just after the answer is written (as the real
        # server's is), so /health may say "no slot available" for a moment.
        deadline = time.monotonic() + 2
        while s.request("/health")[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert s.request("/health")[0] == 200
    with Served("0.0.25", "-m", model) as s:
        assert s.request("/v1/chat/completions", {**chat, "thinking_budget_tokens": 8})[0] == 200
