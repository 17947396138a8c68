"""One model served by two MLX ranks on this machine (issue 16).

`hangar serve` with a cluster of two peers on 127.0.0.1 (`[clusters.loop]`
in config.toml) and models whose settings put them on it: the mlx-lm plugin
plans `mlx.launch` over the ring backend, rank 0 serves HTTP, rank 1
follows it. The official `openai` client must get the same greedy tokens
from the group as from one rank; killing one rank must end the session and
stop every rank (no orphan), and the next request must start the group
again.

Self-contained (it builds only the host and the mlx-lm plugin, and lays out
its own plugins dir), so that it runs without the other engines' builds:
    PY=$(scripts/python-env.sh); $PY -m pytest tests/e2e/test_distributed.py -q
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import (
    REPO,
    Server,
    _python,
    _run,
    http,
    pid_is_gone,
    proc_start_time,
    processes_mentioning,
    wait_until,
)

TARGET = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
HANGAR = TARGET / "debug" / "hangar"
PROMPT = "the quick brown fox"
TOKENS = 12


def _free_ports(n: int) -> int:
    """The first of `n` consecutive loopback ports that are free now."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            first = s.getsockname()[1]
        if first + n > 65535:
            continue
        try:
            held = []
            for p in range(first, first + n):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", p))
            return first
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise RuntimeError("no run of free loopback ports")


@pytest.fixture(scope="module")
def cluster_server(tmp_path_factory):
    python = _python()
    _run(["cargo", "build", "--quiet", "-p", "hangar", "-p", "hangar-plugin-mlx-lm"], "cargo build")
    root = tmp_path_factory.mktemp("hangar-dist")
    plugins = root / "plugins" / "mlx-lm"
    plugins.mkdir(parents=True)
    shutil.copy(REPO / "plugins" / "mlx-lm" / "plugin.toml", plugins / "plugin.toml")
    shutil.copy(TARGET / "debug" / "libhangar_plugin_mlx_lm.so", plugins / "libhangar_plugin_mlx_lm.so")

    models = root / "models"
    models.mkdir()
    make = str(REPO / "scripts" / "make_tiny_model.py")
    # Tensor parallel splits every layer of a Llama; pipelining needs an
    # architecture mlx-lm can split into runs of layers (Qwen2, not Llama).
    _run([python, make, str(models / "solo")], "make_tiny_model.py solo")
    _run([python, make, str(models / "solo-qwen"), "--arch", "qwen2"], "make_tiny_model.py solo-qwen")
    shutil.copytree(models / "solo", models / "duo")
    shutil.copytree(models / "solo-qwen", models / "duo-pipe")
    # mlx-lm's pipeline loader reads the shard index (mlx_lm.convert writes
    # one; the tiny model has a single file).
    _run([python, "-c", (
        "import json, sys, mlx.core as mx; d = sys.argv[1]; "
        "w = mx.load(d + '/model.safetensors'); "
        "json.dump({'metadata': {}, 'weight_map': {k: 'model.safetensors' for k in w}}, "
        "open(d + '/model.safetensors.index.json', 'w'))"
    ), str(models / "duo-pipe")], "writing the shard index")

    port = _free_ports(2)
    config = root / "config.toml"
    config.write_text(
        f'[plugins.mlx-lm]\nprogram = "{python}"\nallow_programs = ["python3"]\n'
        f"[clusters.loop]\nport = {port}\npeers = [\n"
        '  { name = "first", ssh = "127.0.0.1", ip = "127.0.0.1" },\n'
        '  { name = "second", ssh = "127.0.0.1", ip = "127.0.0.1" },\n]\n'
    )
    (root / "settings.toml").write_text(
        '[default_engines]\nmlx = "mlx-lm"\n'
        '[models.duo]\ndistributed = "tensor"\ncluster = "loop"\n'
        '[models.duo-pipe]\ndistributed = "pipeline"\ncluster = "loop"\n'
    )
    state = root / "state"
    state.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANGAR_")}
    env.update(HANGAR_PLATFORM="linux/x86_64/cpu", HANGAR_LOG="info")
    srv = Server(
        "hangar-dist",
        [str(HANGAR), "serve", "--port", "0", "--model-dir", str(models),
         "--plugins-dir", str(root / "plugins"), "--config", str(config),
         "--state-dir", str(state)],
        env,
    )
    yield srv, models
    problems = srv.stop()
    left = wait_until(lambda: not processes_mentioning(str(models)), 5.0)
    if not left:
        problems.append(f"processes still running from {models}: {processes_mentioning(str(models))}")
    if problems:
        pytest.fail("after SIGTERM:\n- " + "\n- ".join(problems) + f"\n{srv.log(60)}", pytrace=False)


def greedy(srv: Server, model: str) -> str:
    import openai

    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=180)
    out = client.completions.create(model=model, prompt=PROMPT, max_tokens=TOKENS, temperature=0)
    assert out.choices[0].text, out
    return out.choices[0].text


def session_of(srv: Server, model: str) -> dict | None:
    status, sessions = http(srv.url + "/api/sessions")
    assert status == 200, sessions
    return next((s for s in sessions["sessions"] if s["model"] == model), None)


@pytest.mark.parametrize("model,solo", [("duo", "solo"), ("duo-pipe", "solo-qwen")])
def test_two_ranks_answer_with_the_greedy_tokens_of_one(cluster_server, model, solo):
    srv, _ = cluster_server
    one = greedy(srv, solo)
    two = greedy(srv, model)
    assert two == one, f"{model}: {two!r} != solo: {one!r}"
    session = session_of(srv, model)
    ranks = session["ranks"]
    assert [(r["rank"], r["peer"], r["local"]) for r in ranks] == [
        (0, "first", True), (1, "second", True)], ranks
    assert all(r["pid"] for r in ranks), ranks
    assert len({r["pid"] for r in ranks} | {session["pid"]}) == 3, session


def test_killing_one_rank_ends_the_group_and_the_next_request_starts_it_again(cluster_server):
    srv, models = cluster_server
    before = greedy(srv, "duo")
    session = session_of(srv, "duo")
    pids = [r["pid"] for r in session["ranks"]] + [session["pid"]]
    starts = {p: proc_start_time(p) for p in pids}
    os.kill(session["ranks"][1]["pid"], signal.SIGKILL)

    # Every rank and the launcher go; none is left behind as an orphan.
    gone = wait_until(lambda: all(pid_is_gone(p, starts[p]) for p in pids), 15.0)
    assert gone, [p for p in pids if not pid_is_gone(p, starts[p])]
    assert wait_until(lambda: session_of(srv, "duo") is None or session_of(srv, "duo")["id"] != session["id"], 5.0)
    status, events = http(srv.url + "/api/events")
    crashed = [e for e in events["events"] if e["kind"] == "crashed" and e["session"] == session["id"]]
    # Whoever saw it first says so: the host (the ranks it found dead; the
    # launcher may have stopped rank 0 already) or the launcher's exit
    # (it stops the other ranks and exits when one dies). The host's own
    # watch is pinned by the `cluster` tests of the host.
    assert len(crashed) == 1, events
    message = crashed[0]["message"]
    assert f"rank 1 on peer 'second' (pid {pids[1]})" in message or (
        "the launcher of its 2 ranks" in message), message
    assert not processes_mentioning(str(models / "duo") + " ")

    # The next request starts the whole group again, with new processes.
    assert greedy(srv, "duo") == before
    again = session_of(srv, "duo")
    assert again["id"] != session["id"]
    assert all(r["pid"] and r["pid"] not in pids for r in again["ranks"]), again
