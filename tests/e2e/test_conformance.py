"""`hangar plugin check` on the repo's engine plugins as
scripts/build-plugins.sh lays them out, with the engines this machine has:
mlx-lm with the venv's interpreter (its engine found and versioned),
mlxcel without its binary (the probe answers "unavailable" in time, and the
plan for a model is still checked), and native-mlx with a tiny model (the
in-process generation, cancellation and error checks). The SDK's example
plugins and the template's plugin are checked by the Rust suite.
"""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import HANGAR


def check(env, plugin: str, *extra: str) -> dict[str, dict]:
    folder = os.path.join(env["plugins_dir"], plugin)
    if not os.path.isdir(folder):
        pytest.fail(f"{folder} was not built: run scripts/build-plugins.sh")
    r = subprocess.run(
        [str(HANGAR), "--json", "--config", str(env["config"]), "plugin", "check", folder, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env["proc_env"], timeout=300,
    )
    assert r.returncode == 0, f"{plugin} fails the conformance suite:\n{r.stdout}\n{r.stderr}"
    report = json.loads(r.stdout)
    assert report["plugin"] == plugin
    return {c["name"]: c for c in report["checks"]}


def test_mlx_lm_conforms_with_its_engine_installed(env):
    checks = check(env, "mlx-lm")
    assert "available, engine" in checks["probe_terminates"]["verdict"], checks["probe_terminates"]
    plan = checks["launch_plan_declared_programs"]
    assert plan["outcome"] == "pass" and env["python"] in plan["verdict"], plan


def test_mlxcel_conforms_without_its_engine(env):
    checks = check(env, "mlxcel")
    assert checks["probe_terminates"]["verdict"].startswith("answered in"), checks["probe_terminates"]
    assert checks["launch_plan_declared_programs"]["outcome"] == "pass"


def test_native_mlx_generates_stops_and_errors_as_the_suite_asks(env):
    checks = check(env, "native-mlx", "--model", str(env["models"] / "tiny-llama"))
    for name in ("engine_loads", "generate_one_outcome", "generate_stops_quickly", "errors_stay_errors"):
        assert checks[name]["outcome"] == "pass", checks[name]


def test_llama_server_conforms_as_a_webassembly_plugin(env):
    checks = check(env, "llama-server")
    assert checks["library_loads"]["outcome"] == "pass", checks["library_loads"]
    assert "0.6.0-dev" in checks["probe_terminates"]["verdict"], checks["probe_terminates"]
    plan = checks["launch_plan_declared_programs"]
    assert plan["outcome"] == "pass" and "llama-server" in plan["verdict"], plan
    assert checks["errors_stay_errors"]["outcome"] == "pass", checks["errors_stay_errors"]
