"""End-to-end: `hangar pull` against tests/stand-ins/hub_server.py (the hub's
HTTP API on loopback; no real hub is reachable here), then `hangar serve`
serving what it pulled from the Hugging Face cache.

Each test starts its own stand-in over a folder of tiny generated
repositories and its own empty cache (HF_HUB_CACHE), and checks what the
pull said, what it left on disk and what the stand-in served.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HANGAR, REPO, Server, _run, http, wait_until

HUB = REPO / "tests" / "stand-ins" / "hub_server.py"
LISTENING = re.compile(r"hub: listening on (http://\S+)")


@pytest.fixture(scope="module")
def repos(tmp_path_factory, env):
    """org/tiny (an MLX model), org/onnx (config.json + model.onnx: no rule
    recognises it), org/gated (a copy of org/tiny behind a token)."""
    root = tmp_path_factory.mktemp("hub-repos")
    tiny = root / "org" / "tiny"
    _run([env["python"], str(REPO / "scripts" / "make_tiny_model.py"), str(tiny)], "make_tiny_model.py")
    shutil.copytree(tiny, root / "org" / "gated")
    onnx = root / "org" / "onnx"
    onnx.mkdir(parents=True)
    (onnx / "config.json").write_text('{"model_type": "bert"}')
    (onnx / "model.onnx").write_bytes(os.urandom(300_000))
    return root


class Hub:
    def __init__(self, repos: Path, *flags: str):
        self.proc = subprocess.Popen([sys.executable, str(HUB), "--repos", str(repos), *flags],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = self.proc.stdout.readline()
        m = LISTENING.search(line)
        assert m, f"the hub stand-in did not start: {line}"
        self.url = m.group(1)

    def served(self) -> dict[str, int]:
        return http(self.url + "/_stats")[1]["bytes"]

    def stop(self):
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def hub_for(repos):
    started = []

    def start(*flags: str) -> Hub:
        hub = Hub(repos, *flags)
        started.append(hub)
        return hub

    yield start
    for hub in started:
        hub.stop()


def pull(env, hub: Hub, cache: Path, *args: str, extra_env: dict | None = None, timeout=300):
    proc_env = dict(env["proc_env"])
    proc_env.pop("HF_TOKEN", None)
    proc_env.update(HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(cache), **(extra_env or {}))
    r = subprocess.run([str(HANGAR), "pull", *args, "--plugins-dir", env["plugins_dir"],
                        "--config", str(env["config"])],
                       env=proc_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def snapshots(cache: Path, repo: str) -> list[Path]:
    folder = cache / ("models--" + repo.replace("/", "--")) / "snapshots"
    return sorted(p for p in folder.iterdir() if not p.name.startswith(".")) if folder.is_dir() else []


def resolve_sees(env, cache: Path, repo: str) -> tuple[int, str]:
    """What `hangar resolve` makes of the repository's cache folder."""
    r = subprocess.run([str(HANGAR), "resolve", str(cache / ("models--" + repo.replace("/", "--"))),
                        "--plugins-dir", env["plugins_dir"], "--config", str(env["config"])],
                       env=env["proc_env"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return r.returncode, r.stdout


def test_a_pulled_model_is_served_from_the_cache(env, hub_for, tmp_path):
    hub = hub_for()
    cache = tmp_path / "hub"
    code, out, err = pull(env, hub, cache, "org/tiny")
    assert code == 0, out + err
    assert "format mlx" in out and "served by mlx-lm" in out, out
    assert "memory guard" in out, out
    [snap] = snapshots(cache, "org/tiny")
    link = snap / "model.safetensors"
    assert link.is_symlink() and os.readlink(link).startswith("../../blobs/"), link
    refs = cache / "models--org--tiny" / "refs" / "main"
    assert refs.read_text() == snap.name
    # Nothing left half-done.
    assert not list((cache / "models--org--tiny" / "blobs").glob("*.incomplete"))
    # A second pull fetches nothing.
    before = sum(hub.served().values())
    code, out, err = pull(env, hub, cache, "org/tiny")
    assert code == 0 and "(0 B fetched)" in out, out + err
    assert sum(hub.served().values()) == before

    # Served from where the pull put it, the model dirs left as they were.
    serve_env = dict(env["proc_env"], HF_HUB_CACHE=str(cache))
    srv = Server("hangar-pulled", env["base_args"], serve_env)
    try:
        assert f"reading the Hugging Face cache {cache} too" in srv.log(), srv.log()
        status, models = http(srv.url + "/v1/models")
        assert status == 200 and "org/tiny" in [m["id"] for m in models["data"]], models
        status, answer = http(srv.url + "/v1/chat/completions", "POST",
                              {"model": "org/tiny", "messages": [{"role": "user", "content": "hi"}],
                               "max_tokens": 4})
        assert status == 200, answer
        assert answer["choices"][0]["message"]["content"] is not None
    finally:
        assert srv.stop() == []


def hangar_cmd(env, *args: str, config: Path | None = None, **extra_env: str):
    r = subprocess.run([str(HANGAR), *args, "--url", "http://127.0.0.1:9", "--model-dir", str(env["models"]),
                        "--plugins-dir", env["plugins_dir"], "--config", str(config or env["config"])],
                       env=dict(env["proc_env"], **extra_env), stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    return r.returncode, r.stdout, r.stderr


def test_models_and_rm_see_the_pull_cache_and_the_config_can_leave_it_out(env, hub_for, tmp_path):
    hub = hub_for()
    cache = tmp_path / "hub"
    code, out, err = pull(env, hub, cache, "org/tiny")
    assert code == 0, out + err
    code, out, err = hangar_cmd(env, "models", "--json", HF_HUB_CACHE=str(cache))
    assert code == 0, err
    listed = {m["id"]: m for m in json.loads(out)["models"]}
    assert listed["org/tiny"]["source"] == "hf_cache" and "tiny-llama" in listed, listed
    assert listed["org/tiny"]["path"].startswith(str(cache)), listed

    # `hf_cache = false`: the model dirs alone, for serve, models and rm.
    off = tmp_path / "config.toml"
    off.write_text("hf_cache = false\n" + env["config"].read_text())
    shutil.copy(env["config"].parent / "settings.toml", tmp_path / "settings.toml")
    code, out, err = hangar_cmd(env, "models", "--json", config=off, HF_HUB_CACHE=str(cache))
    assert code == 0, err
    assert "org/tiny" not in [m["id"] for m in json.loads(out)["models"]], out
    code, out, err = hangar_cmd(env, "rm", "org/tiny", "--yes", config=off, HF_HUB_CACHE=str(cache))
    assert code != 0 and "no model 'org/tiny'" in err, err
    args = list(env["base_args"])
    args[args.index("--config") + 1] = str(off)
    srv = Server("hangar (hf_cache = false)", args, dict(env["proc_env"], HF_HUB_CACHE=str(cache)))
    try:
        assert "Hugging Face cache" not in srv.log(), srv.log()
        status, models = http(srv.url + "/v1/models")
        assert "org/tiny" not in [m["id"] for m in models["data"]], models
    finally:
        assert srv.stop() == []

    code, out, err = hangar_cmd(env, "rm", "org/tiny", "--yes", HF_HUB_CACHE=str(cache))
    assert code == 0 and "removed 'org/tiny'" in out, out + err
    assert not (cache / "models--org--tiny").exists()


def test_json_events_one_per_line(env, hub_for, tmp_path):
    hub = hub_for()
    code, out, err = pull(env, hub, tmp_path / "hub", "org/tiny", "--json")
    assert code == 0, out + err
    events = [json.loads(line) for line in out.splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "plan" and kinds[-1] == "done", kinds
    assert kinds.count("file") == len(events[0]["files"])
    assert events[0]["engine"] == "mlx-lm" and events[0]["format"] == "mlx"


def test_a_broken_download_resumes_where_it_stopped(env, hub_for, tmp_path):
    cache = tmp_path / "hub"
    hub = hub_for("--break-after", "200000")
    code, out, err = pull(env, hub, cache, "org/tiny", "--include", "*.safetensors", "--include", "*.json")
    assert code != 0
    assert "broke off after 200000" in err and "run the same `hangar pull` again" in err, err
    assert snapshots(cache, "org/tiny") == []  # not a model yet
    [partial] = list((cache / "models--org--tiny" / "blobs").glob("*.incomplete"))
    assert partial.stat().st_size == 200000
    # What it hashed is kept, so that the resume hashes only the rest.
    checkpoint = partial.with_name(partial.name + ".sha256")
    assert checkpoint.is_file()
    code, text = resolve_sees(env, cache, "org/tiny")
    assert code != 0 and "did not finish" in text, text
    served_before = hub.served()["model.safetensors"]
    code, out, err = pull(env, hub, cache, "org/tiny", "--include", "*.safetensors", "--include", "*.json")
    assert code == 0, out + err
    total = (snapshots(cache, "org/tiny")[0] / "model.safetensors").stat().st_size
    # The second pull fetched only the rest.
    assert hub.served()["model.safetensors"] - served_before == total - 200000
    assert not partial.exists() and not checkpoint.exists()


def test_a_killed_pull_continues_where_it_stopped(env, hub_for, tmp_path):
    cache = tmp_path / "hub"
    hub = hub_for("--break-after", "150000", "--break-mode", "stall")
    proc_env = dict(env["proc_env"], HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(cache))
    proc = subprocess.Popen([str(HANGAR), "pull", "org/tiny", "--include", "model.safetensors", "--include", "*.json",
                             "--plugins-dir", env["plugins_dir"], "--config", str(env["config"])],
                            env=proc_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    blobs = cache / "models--org--tiny" / "blobs"
    got = wait_until(lambda: [p for p in blobs.glob("*.incomplete") if p.stat().st_size == 150000], 30)
    proc.kill()
    proc.wait()
    assert got, "the pull never wrote its partial"
    served_before = hub.served()["model.safetensors"]
    code, out, err = pull(env, hub, cache, "org/tiny", "--include", "model.safetensors", "--include", "*.json")
    assert code == 0, out + err
    total = (snapshots(cache, "org/tiny")[0] / "model.safetensors").stat().st_size
    assert hub.served()["model.safetensors"] - served_before == total - 150000


def test_a_corrupted_byte_is_refused_by_the_checksum(env, hub_for, tmp_path):
    cache = tmp_path / "hub"
    hub = hub_for("--corrupt", "model.safetensors")
    code, out, err = pull(env, hub, cache, "org/tiny")
    assert code != 0
    assert "model.safetensors failed its checksum" in err and "was deleted" in err, err
    assert snapshots(cache, "org/tiny") == []
    assert not list((cache / "models--org--tiny" / "blobs").glob("*.incomplete"))
    assert not (cache / "models--org--tiny" / "refs").exists()


def test_a_gated_repo_without_a_token_says_to_set_hf_token(env, hub_for, tmp_path):
    hub = hub_for("--gated", "org/gated", "--token", "hf_secret")
    code, out, err = pull(env, hub, tmp_path / "hub", "org/gated")
    assert code != 0
    assert "401" in err and "set HF_TOKEN" in err, err
    code, out, err = pull(env, hub, tmp_path / "hub", "org/gated", extra_env={"HF_TOKEN": "wrong"})
    assert code != 0 and "the token in HF_TOKEN may not read" in err, err
    code, out, err = pull(env, hub, tmp_path / "hub", "org/gated", extra_env={"HF_TOKEN": "hf_secret"})
    assert code == 0, out + err


def test_a_mirror_endpoint_is_used(env, hub_for, tmp_path):
    # Two stand-ins: the pull must go to the one HF_ENDPOINT names.
    other, mirror = hub_for(), hub_for()
    code, out, err = pull(env, mirror, tmp_path / "hub", "org/tiny")
    assert code == 0, out + err
    assert mirror.url in out
    assert sum(mirror.served().values()) > 0 and other.served() == {}


def test_an_unservable_repo_is_refused_before_any_download(env, hub_for, tmp_path):
    cache = tmp_path / "hub"
    hub = hub_for()
    code, out, err = pull(env, hub, cache, "org/onnx")
    assert code != 0
    assert "refusing to pull org/onnx" in err and "--force" in err, err
    assert hub.served() == {}
    assert not cache.exists()
    code, out, err = pull(env, hub, cache, "org/onnx", "--force")
    assert code == 0, out + err
    assert hub.served()["model.onnx"] == 300_000


def test_a_model_too_big_for_the_memory_guard_is_refused_unless_forced(env, repos, tmp_path):
    # A petabyte of weights: above any machine's ceiling.
    hub = Hub(repos, "--huge", "org/tiny")
    try:
        cache = tmp_path / "hub"
        code, out, err = pull(env, hub, cache, "org/tiny")
        assert code != 0
        assert "does NOT fit under the balanced memory guard's ceiling" in out, out
        assert re.search(r"refusing to pull org/tiny: it needs about \S+ TiB of memory, more than the "
                         r"balanced memory guard's ceiling of .*; pass --force to download it anyway", err), err
        code, out, err = pull(env, hub, cache, "org/tiny", "--json")
        assert code != 0
        events = [json.loads(line) for line in out.splitlines()]
        assert [e["event"] for e in events] == ["plan", "error"] and events[0]["fits"] is False, events
        assert "refusing to pull org/tiny" in events[1]["message"], events
        assert hub.served() == {}
        assert not cache.exists()
        # Forced, it goes on to the next check (which no disk passes).
        code, out, err = pull(env, hub, cache, "org/tiny", "--force")
        assert code != 0 and "not enough disk space" in err, err
    finally:
        hub.stop()


def test_not_enough_disk_space_fails_cleanly(env, repos, tmp_path):
    hub = Hub(repos, "--huge", "org/tiny")
    try:
        cache = tmp_path / "hub"
        # No memory guard: the disk is what refuses it.
        code, out, err = pull(env, hub, cache, "org/tiny", "--memory-guard", "off")
        assert code != 0
        assert "not enough disk space to pull org/tiny" in err and "bytes) free" in err, err
        assert hub.served() == {}
        assert not cache.exists()
    finally:
        hub.stop()


def test_bad_input_is_named(env, hub_for, tmp_path):
    hub = hub_for()
    code, out, err = pull(env, hub, tmp_path / "hub", "org/a/b")
    assert code != 0 and "'org/a/b' is not a repository" in err, err
    code, out, err = pull(env, hub, tmp_path / "hub", "org/missing")
    assert code != 0 and "404" in err and "org/missing" in err, err
    code, out, err = pull(env, hub, tmp_path / "hub", "org/tiny", "--include", "*.gguf")
    assert code != 0 and "no file of org/tiny matches --include *.gguf" in err, err
