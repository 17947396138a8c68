"""Fixtures of Hangar's end-to-end suite: a real `hangar serve` with a real
`mlx_lm.server` behind it, driven by the official `openai` package.

Once per session this builds the host (`cargo build -p hangar`) and the
plugins (`scripts/build-plugins.sh`), writes two tiny random-weight models
(`tiny-llama`, `tiny-qwen`) and two folders that are not models (`broken`:
config.json without weights; `bad-json`: an invalid config.json), writes a
Hangar config, and starts the server on a free loopback port. Its stderr is
drained on a thread into a buffer that is attached to every failing test's
report. At the end the server gets SIGTERM, and the suite checks that no
engine outlived it and that it left no zombie.

Run with the venv from scripts/python-env.sh (it has mlx-lm, openai, pytest):
    PY=$(scripts/python-env.sh); $PY -m pytest tests/e2e -x -q
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import struct
import subprocess
import threading
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HANGAR = REPO / "target" / "debug" / "hangar"
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30
SERVING = re.compile(r"hangar: serving (\d+) model\(s\) on http://(\S+)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")

# Every server started in this session, so that a failing test's report can
# show what the host printed.
_SERVERS: list["Server"] = []


# --------------------------------------------------------------------------
# processes


def proc_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def proc_status(pid: int) -> dict[str, str]:
    """The fields of /proc/PID/status, or {} when no such process exists."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def proc_start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat: tells a pid from a later reuse of it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def children(pid: int) -> list[int]:
    return [p for p in all_pids() if proc_status(p).get("PPid") == str(pid)]


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        for child in children(todo.pop()):
            out.append(child)
            todo.append(child)
    return out


def is_zombie(pid: int) -> bool:
    return proc_status(pid).get("State", "").startswith("Z")


def pid_is_gone(pid: int, start_time: int | None = None) -> bool:
    """True when no process (not even a zombie) has this pid, or the pid now
    belongs to a process that started later."""
    if not proc_status(pid):
        return True
    return start_time is not None and proc_start_time(pid) != start_time


def processes_mentioning(text: str, exclude: set[int] = frozenset()) -> list[str]:
    me = os.getpid()
    return [
        f"{p}: {cmd}"
        for p in all_pids()
        if p != me and p not in exclude and text in (cmd := proc_cmdline(p))
    ]


def wait_until(predicate, timeout: float, interval: float = 0.05):
    """Polls `predicate` until it returns something truthy; returns the last
    value (falsy on timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


# --------------------------------------------------------------------------
# the server


class Server:
    """One `hangar serve` process, its address and its drained stderr."""

    def __init__(self, name: str, args: list[str], env: dict[str, str]):
        self.name = name
        self.args = args
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._serving = threading.Event()
        self.url = ""
        self.model_count = -1
        self.stop_seconds: float | None = None
        # The test that started it ("" for session fixtures' setup too).
        self.started_by = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
        self.proc = subprocess.Popen(
            args,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=REPO,
        )
        self._drain = threading.Thread(target=self._read, name=f"{name}-stderr", daemon=True)
        self._drain.start()
        _SERVERS.append(self)
        if not self._serving.wait(START_TIMEOUT_S) or not self.url:
            self.kill()
            raise RuntimeError(
                f"{name}: no 'hangar: serving' line within {START_TIMEOUT_S} s "
                f"(exit code {self.proc.poll()}); stderr:\n{self.log()}"
            )

    def _read(self):
        for raw in self.proc.stderr:
            line = ANSI.sub("", raw.decode(errors="replace").rstrip("\n"))
            with self._lock:
                self.lines.append(line)
            if not self._serving.is_set() and (m := SERVING.search(line)):
                self.model_count = int(m.group(1))
                self.url = "http://" + m.group(2)
                self._serving.set()
        self._serving.set()  # it exited: stop waiting for the line

    def log(self, last: int | None = None) -> str:
        with self._lock:
            lines = self.lines[-last:] if last else list(self.lines)
        return "\n".join(lines)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout: float = STOP_TIMEOUT_S, check_zombies: bool = True) -> list[str]:
        """SIGTERM, wait, and return the problems found: a host that did not
        exit within `timeout`, engines or keepers that outlived it, zombies
        it left. `self.stop_seconds` says how long it took to exit."""
        problems = []
        self.stop_seconds = None
        if self.proc.poll() is not None:
            return [f"{self.name} had already exited with {self.proc.returncode}"]
        # Zombies among its children while it runs: give a just-exited child
        # a moment to be reaped before calling it a leak.
        zombies = check_zombies and wait_until(
            lambda: not [p for p in children(self.pid) if is_zombie(p)], 2.0
        )
        if check_zombies and not zombies:
            left = [f"{p}: {proc_status(p).get('Name')}" for p in children(self.pid) if is_zombie(p)]
            problems.append(f"{self.name} has zombie children while running: {left}")
        family = {p: proc_start_time(p) for p in descendants(self.pid)}
        sent = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
            self.stop_seconds = time.monotonic() - sent
        except subprocess.TimeoutExpired:
            problems.append(f"{self.name} did not exit within {timeout} s of SIGTERM")
            self.kill()
        self._drain.join(5)
        # Its engines and keepers must be gone, zombies included (a zombie
        # left to init means the host exited before reaping its child).
        time.sleep(0.2)
        for p, start in family.items():
            if not pid_is_gone(p, start):
                st = proc_status(p)
                problems.append(
                    f"{self.name}'s process {p} ({st.get('Name')}, state {st.get('State')}, "
                    f"cmdline {proc_cmdline(p)!r}) outlived it"
                )
        return problems


def http(
    url: str,
    method: str = "GET",
    body: object | bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 120,
) -> tuple[int, object]:
    """A raw request: (status, parsed JSON body, or the text when not JSON)."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


# --------------------------------------------------------------------------
# session setup


def png(width: int = 8, height: int = 8, blue: int = 128) -> bytes:
    """A small RGB gradient (red across, green down, `blue` throughout) as
    a PNG file, with no imaging library."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(
        b"\0" + b"".join(bytes((x * 32 % 256, y * 32 % 256, blue)) for x in range(width)) for y in range(height)
    )
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def _python() -> str:
    env_python = os.environ.get("HANGAR_PYTHON")
    if env_python:
        return env_python
    out = subprocess.run(
        [str(REPO / "scripts" / "python-env.sh")], check=True, stdout=subprocess.PIPE, text=True
    ).stdout
    return out.strip().splitlines()[-1]


def _run(cmd: list[str], what: str) -> str:
    r = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        pytest.fail(f"{what} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}", pytrace=False)
    return r.stdout


@pytest.fixture(scope="session")
def env(tmp_path_factory):
    """Builds everything and lays out the model dir, config and state dir."""
    python = _python()
    plugins_dir = _run([str(REPO / "scripts" / "build-plugins.sh")], "scripts/build-plugins.sh")
    plugins_dir = plugins_dir.strip().splitlines()[-1]
    _run(["cargo", "build", "--quiet", "-p", "hangar"], "cargo build -p hangar")
    assert HANGAR.is_file(), HANGAR

    root = tmp_path_factory.mktemp("hangar-e2e")
    models = root / "models"
    models.mkdir()
    make = str(REPO / "scripts" / "make_tiny_model.py")
    _run([python, make, str(models / "tiny-llama")], "make_tiny_model.py tiny-llama")
    _run([python, make, str(models / "tiny-qwen"), "--arch", "qwen2"], "make_tiny_model.py tiny-qwen")
    (models / "broken").mkdir()
    shutil.copy(models / "tiny-llama" / "config.json", models / "broken" / "config.json")
    (models / "bad-json").mkdir()
    (models / "bad-json" / "config.json").write_text('{"model_type": "llama", "hidden_size": ')
    shutil.copy(models / "tiny-llama" / "model.safetensors", models / "bad-json" / "model.safetensors")

    config = root / "config.toml"
    llama_server = os.path.join(os.path.dirname(python), "llama-server")
    config.write_text(
        f'[plugins.mlx-lm]\nprogram = "{python}"\nallow_programs = ["python3"]\n'
        f'[plugins.llama-server]\nprogram = "{llama_server}"\n'
        f'[wasm]\ncache_dir = "{root / "wasm-cache"}"\n'
    )
    # This suite is about mlx-lm; native-mlx (which outranks it) has its own.
    (root / "settings.toml").write_text(
        '[default_engines]\nmlx = "mlx-lm"\n[models.tiny-llama]\nmax_tokens = 64\n'
    )
    state = root / "state"
    state.mkdir()

    proc_env = {k: v for k, v in os.environ.items() if k not in ("HANGAR_API_KEY", "HANGAR_MODEL_DIR",
                                                               "HANGAR_PLUGINS_DIR", "HANGAR_CONFIG",
                                                               "HANGAR_SETTINGS")}
    # `hangar serve`, `models` and `rm` read the Hugging Face cache that
    # `hangar pull` fills: one of the suite's own (absent until a test
    # pulls into it), never this machine's.
    proc_env.update(HANGAR_PLATFORM="linux/x86_64/cpu", HANGAR_LOG="info",
                    HF_HUB_CACHE=str(root / "hf-cache"))
    base_args = [
        str(HANGAR), "serve", "--port", "0",
        "--model-dir", str(models),
        "--plugins-dir", plugins_dir,
        "--config", str(config),
        "--state-dir", str(state),
    ]
    return {
        "python": python,
        "root": root,
        "models": models,
        "plugins_dir": plugins_dir,
        "config": config,
        "state": state,
        "proc_env": proc_env,
        "base_args": base_args,
    }


@pytest.fixture(scope="session")
def server(env):
    """The main `hangar serve`; at the end: no orphan engine, no zombie."""
    srv = Server("hangar", env["base_args"], env["proc_env"])
    yield srv
    problems = srv.stop()
    # Nothing anywhere may still run from the model dir: no orphan engine.
    left = wait_until(lambda: not processes_mentioning(str(env["models"])), 2.0)
    if not left:
        problems.append(f"processes still running from {env['models']}: {processes_mentioning(str(env['models']))}")
    if problems:
        pytest.fail(
            "after SIGTERM:\n- " + "\n- ".join(problems) + f"\nhost stderr (tail):\n{srv.log(60)}",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def base_url(server) -> str:
    return server.url


@pytest.fixture(scope="session")
def client(server):
    import openai

    # No retries: a failure must show, not be hidden by a second attempt.
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def api(server):
    """`api(path, method="GET", body=None)` → (status, json) against the server."""

    def call(path: str, method: str = "GET", body=None, headers=None, timeout: float = 120):
        return http(server.url + path, method, body, headers, timeout)

    return call


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        # The servers still running, and those this test started.
        for srv in _SERVERS:
            if srv.proc.poll() is None or srv.started_by == item.nodeid:
                report.sections.append((f"{srv.name} stderr (pid {srv.pid}, last 80 lines)", srv.log(80)))
