"""The stand-in itself: it must refuse exactly the flags the reference says
each version lacks, or it could not catch a plugin that passes them."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

STAND_IN = Path(__file__).with_name("mlxcel_server.py")


def run(version: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, MLXCEL_STANDIN_VERSION=version)
    return subprocess.run([sys.executable, str(STAND_IN), *args], env=env, capture_output=True, text=True, timeout=20)


@pytest.mark.parametrize("version", ["0.0.20", "0.4.2", "nightly-abc"])
def test_version_is_printed_like_clap(version):
    r = run(version, "--version")
    assert (r.returncode, r.stdout) == (0, f"mlxcel-server {version}\n")


@pytest.mark.parametrize("version,flag,accepted", [
    ("0.0.20", ["--cache-type-k", "int8"], True),
    ("0.0.20", ["--decode-storage-backend", "paged"], False),
    ("0.0.20", ["--prompt-cache-enabled"], False),
    ("0.0.26", ["--cache-type-k", "turbo4"], True),
    ("0.0.21", ["--cache-type-k", "turbo4"], False),
    ("0.0.26", ["--draft-kind", "mtp"], False),
    ("0.0.27", ["--draft-kind", "mtp"], True),
    ("0.0.27", ["--node-role", "prefill"], True),
    ("0.1.0", ["--kv-cache-budget", "auto"], False),
    ("0.4.2", ["--kv-cache-budget", "auto"], True),
    ("nightly-abc", ["--cache-type-k", "int8"], False),
    ("nightly-abc", ["-c", "128"], True),
    ("0.4.2", ["--no-such-flag"], False),
])
def test_flags_are_accepted_only_from_their_version(tmp_path, version, flag, accepted):
    (tmp_path / "config.json").write_text("{}")
    # `--help` after the flags: a run that parses everything exits 0 without serving.
    r = run(version, "-m", str(tmp_path), *flag, "--help")
    if accepted:
        assert r.returncode == 0, r.stderr
    else:
        assert r.returncode == 2 and r.stderr.startswith("error: "), (r.returncode, r.stderr)
