"""End-to-end: `hangar models`, `hangar ps` and `hangar rm` (the real
binaries) against a running `hangar serve` over a model dir of tiny
generated models and a fake Hugging Face cache (blobs, snapshot links,
refs/main), including `rm` at a terminal (asking, `n` keeping and `y`
removing), and `rm` of a loaded model: refused, then `--force` unloads it
through the API and removes it, and the catalog drops it.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import HANGAR, Server, http, wait_until


def cache_repo(cache: Path, repo: str, source: Path, revision: str = "abc123") -> Path:
    """`source`'s files as the Hugging Face cache lays out repository
    `repo`: each file a blob, linked from snapshots/REV, refs/main → REV."""
    folder = cache / ("models--" + repo.replace("/", "--"))
    snap = folder / "snapshots" / revision
    (folder / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    (folder / "refs").mkdir()
    for i, f in enumerate(sorted(p for p in source.iterdir() if p.is_file())):
        blob = folder / "blobs" / f"blob{i}"
        shutil.copy(f, blob)
        (snap / f.name).symlink_to(f"../../blobs/blob{i}")
    (folder / "refs" / "main").write_text(revision)
    return folder


@pytest.fixture(scope="module")
def layout(env, tmp_path_factory):
    root = tmp_path_factory.mktemp("models-cmd")
    models = root / "models"
    models.mkdir()
    for name in ("local-a", "local-b"):
        shutil.copytree(env["models"] / "tiny-llama", models / name)
    cache = root / "hf" / "hub"
    cache.mkdir(parents=True)
    repo = cache_repo(cache, "org/cached", env["models"] / "tiny-llama")
    return {"models": models, "cache": cache, "repo": repo}


@pytest.fixture(scope="module")
def srv(env, layout):
    args = list(env["base_args"])
    args[args.index("--model-dir") + 1] = str(layout["models"])
    args += ["--model-dir", str(layout["cache"])]
    server = Server("hangar-models-cmd", args, env["proc_env"])
    yield server
    assert server.stop() == []


def hangar(env, layout, *args: str, url: str, stdin=subprocess.DEVNULL):
    # `ps` asks the server alone; `models` and `rm` read the same dirs it serves.
    dirs = [] if args[0] == "ps" else ["--model-dir", str(layout["models"]),
                                       "--model-dir", str(layout["cache"])]
    cmd = [str(HANGAR), *args, "--url", url, *dirs,
           "--plugins-dir", env["plugins_dir"], "--config", str(env["config"])]
    r = subprocess.run(cmd, env=env["proc_env"], stdin=stdin, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=180)
    return r.returncode, r.stdout, r.stderr


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def listed(env, layout, url) -> dict:
    code, out, err = hangar(env, layout, "models", "--json", url=url)
    assert code == 0, out + err
    return {m["id"]: m for m in json.loads(out)["models"]}


def test_models_lists_sizes_engines_and_places(env, layout, srv):
    models = listed(env, layout, srv.url)
    assert {"local-a", "local-b", "org/cached"} <= set(models), models
    a = models["local-a"]
    assert a["format"] == "mlx" and a["kind"] == "chat" and a["engine"] == "mlx-lm", a
    assert a["size_bytes"] == folder_bytes(layout["models"] / "local-a")
    assert a["loaded"] is False and a["source"] == "model_dir"
    assert a["path"] == str(layout["models"] / "local-a")
    cached = models["org/cached"]
    # The blobs, each once; the links count nothing.
    assert cached["size_bytes"] == folder_bytes(layout["repo"] / "blobs")
    assert cached["source"] == "hf_cache"
    assert cached["path"].endswith("models--org--cached/snapshots/abc123")
    # The table: a header and one aligned row per model.
    code, out, err = hangar(env, layout, "models", url=srv.url)
    assert code == 0, err
    header, *rows = out.splitlines()
    assert header.split()[:6] == ["MODEL", "FORMAT", "KIND", "ENGINE", "SIZE", "LOADED"], out
    size_col = header.index("SIZE")
    assert all(len(r) > size_col for r in rows), out
    assert any(r.split()[0] == "org/cached" and "hf_cache" in r.split() for r in rows), out
    # The API agrees.
    status, body = http(srv.url + "/api/models")
    assert status == 200
    api = {m["model"]["id"]: m for m in body["models"]}
    assert api["local-a"]["size_bytes"] == a["size_bytes"] and api["local-a"]["loaded"] is False


def test_without_a_server_models_says_not_running_and_ps_fails(env, layout):
    dead = "http://127.0.0.1:9"  # the discard port: nothing listens
    code, out, err = hangar(env, layout, "models", url=dead)
    assert code == 0, err
    assert "not running" in out, out
    code, out, err = hangar(env, layout, "models", "--json", url=dead)
    answer = json.loads(out)
    assert answer["server"] == "not running" and all(m["loaded"] is None for m in answer["models"])
    code, out, err = hangar(env, layout, "ps", url=dead)
    assert code != 0 and "no hangar server answers" in err, out + err


def test_rm_unknown_and_without_yes_off_a_terminal(env, layout, srv):
    code, out, err = hangar(env, layout, "rm", "nope", "--yes", url=srv.url)
    assert code != 0 and "'nope'" in err and "hangar models" in err, err
    code, out, err = hangar(env, layout, "rm", "local-b", url=srv.url)
    assert code != 0 and "--yes" in err, err
    assert (layout["models"] / "local-b").is_dir(), "nothing removed without --yes"


def test_rm_on_a_terminal_asks_first(env, layout, srv):
    """stdin a terminal: the plan and a question; 'n' keeps the model."""
    import os
    import pty

    master, slave = pty.openpty()
    try:
        os.write(master, b"n\n")
        code, out, err = hangar(env, layout, "rm", "local-b", url=srv.url, stdin=slave)
    finally:
        os.close(slave)
        os.close(master)
    assert code != 0 and "remove? [y/N]" in err and "nothing removed" in err, out + err
    assert str(layout["models"] / "local-b") in err, err
    assert (layout["models"] / "local-b").is_dir()


def test_rm_on_a_terminal_removes_on_yes(env, layout, srv):
    """stdin a terminal: 'y' at the question removes the model, and the
    running server's catalog drops it at once."""
    import os
    import pty

    master, slave = pty.openpty()
    try:
        os.write(master, b"y\n")
        code, out, err = hangar(env, layout, "rm", "local-b", url=srv.url, stdin=slave)
    finally:
        os.close(slave)
        os.close(master)
    assert code == 0 and "remove? [y/N]" in err, out + err
    assert "removed 'local-b', freed" in out and "nothing removed" not in err, out + err
    assert not (layout["models"] / "local-b").exists()
    status, body = http(srv.url + "/api/models")
    assert "local-b" not in [m["model"]["id"] for m in body["models"]], body


def test_rm_of_a_loaded_model_is_refused_then_forced(env, layout, srv):
    status, body = http(srv.url + "/api/models/local-a/load", "POST", {})
    assert status == 200, body
    code, out, err = hangar(env, layout, "ps", "--json", url=srv.url)
    assert code == 0, err
    [row] = [s for s in json.loads(out)["sessions"] if s["model"] == "local-a"]
    assert row["engine"] == "mlx-lm" and row["state"] in ("ready", "busy"), row
    assert row["idle_seconds"] >= 0 and row["estimate_bytes"] > 0, row
    code, out, err = hangar(env, layout, "ps", url=srv.url)
    assert code == 0 and "local-a" in out and "TTL LEFT" in out, out + err

    code, out, err = hangar(env, layout, "rm", "local-a", "--yes", url=srv.url)
    assert code != 0 and "is loaded" in err and "--force" in err, err
    assert (layout["models"] / "local-a").is_dir()

    code, out, err = hangar(env, layout, "rm", "local-a", "--yes", "--force", "--json", url=srv.url)
    assert code == 0, out + err
    removed = json.loads(out)
    assert removed["unloaded"] is True and removed["bytes"] > 0, removed
    assert not (layout["models"] / "local-a").exists()
    status, sessions = http(srv.url + "/api/sessions")
    assert [s["model"] for s in sessions["sessions"]] == [], sessions
    status, body = http(srv.url + "/api/models")
    assert "local-a" not in [m["model"]["id"] for m in body["models"]], body
    assert "local-a" not in listed(env, layout, srv.url)


def test_rm_of_a_cache_model_removes_the_repository(env, layout, srv):
    code, out, err = hangar(env, layout, "rm", "org/cached", "--yes", url=srv.url)
    assert code == 0, out + err
    assert "removed 'org/cached'" in out, out
    assert not layout["repo"].exists()
    assert layout["cache"].is_dir(), "the cache itself stays"
    ok = wait_until(lambda: "org/cached" not in
                    [m["model"]["id"] for m in http(srv.url + "/api/models")[1]["models"]], 5)
    assert ok
