"""`hangar bench` end to end: the real engines here (native-mlx and mlx-lm
on the tiny MLX model, llama-server on the same tiny Llama as GGUF), each
loaded by a `hangar serve` child through its management API, asked through
its OpenAI API; the JSON record's shape and provenance, the Markdown and
SVG files, `--compare`, and the refusals and flag errors.
"""
from __future__ import annotations

import json
import os
import subprocess
import xml.etree.ElementTree as ET

import pytest

from conftest import HANGAR, REPO, _run

ROUNDS = 2
SMALL = ["--prompt-tokens", "8", "--gen-tokens", "4", "--concurrency", "1,2"]


@pytest.fixture(scope="module")
def bench(env, tmp_path_factory):
    """Runs `hangar bench` with the suite's plugins and config; returns a
    function of the extra arguments that gives the finished process."""
    tmp = tmp_path_factory.mktemp("bench")
    gguf = tmp / "tiny-gguf.gguf"
    _run([env["python"], str(REPO / "scripts" / "make_tiny_gguf.py"), str(gguf)], "make_tiny_gguf.py")
    proc_env = dict(env["proc_env"], HANGAR_SETTINGS=str(tmp / "settings.toml"))

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(HANGAR), "bench", *args, "--plugins-dir", env["plugins_dir"], "--config", str(env["config"])],
            env=proc_env, cwd=tmp, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
        )

    run.tmp, run.llama, run.gguf = tmp, str(env["models"] / "tiny-llama"), str(gguf)
    return run


@pytest.fixture(scope="module")
def record(bench):
    """One run of all three engines, with every output file."""
    r = bench(bench.llama, bench.gguf, "--allow-different-files", "--rounds", str(ROUNDS), "--seed", "7",
              *SMALL, "--json-file", "run.json", "--markdown", "run.md", "--svg", "run.svg")
    assert r.returncode == 0, r.stderr
    return r, json.loads((bench.tmp / "run.json").read_text())


def test_every_engine_is_measured_with_medians_and_spreads(record):
    proc, rec = record
    engines = {(e["engine"], e["model"]["id"]) for e in rec["engines"]}
    assert engines == {("native-mlx", "tiny-llama"), ("mlx-lm", "tiny-llama"), ("llama-server", "tiny-gguf")}, engines
    for e in rec["engines"]:
        for summary in [e["load_s"], e["ttft_cold_s"]["8"], e["ttft_warm_s"]["8"], e["aggregate_tps"]["1"],
                        e["aggregate_tps"]["2"], e["peak_rss_bytes"]]:
            assert len(summary["samples"]) == ROUNDS, (e["engine"], summary)
            assert 0 < summary["min"] <= summary["median"] <= summary["max"], (e["engine"], summary)
        assert e["peak_rss_bytes"]["min"] > 10 * 2**20, e["peak_rss_bytes"]
        assert e["prompt_tokens_counted"]["8"] > 0, e
    # The table on stdout names every engine and the columns asked for.
    assert "TTFT cold ms @8" in proc.stdout and "tok/s x2" in proc.stdout, proc.stdout
    for name in ("native-mlx", "mlx-lm", "llama-server"):
        assert name in proc.stdout, proc.stdout


def test_the_record_keeps_its_provenance(record):
    _, rec = record
    assert rec["schema"] == 1 and rec["hangar_version"], rec
    assert rec["platform"]["platform"] == "linux/x86_64/cpu" and rec["platform"]["cpus"] >= 1, rec["platform"]
    assert rec["platform"]["memory_bytes"] > 0 and rec["platform"]["cpu_model"], rec["platform"]
    assert rec["started_at"] <= rec["ended_at"] and len(rec["load_average"]["start"]) == 3, rec
    p = rec["protocol"]
    assert p == {"rounds": ROUNDS, "warmup": True, "prompt_tokens": [8], "gen_tokens": 4, "concurrency": [1, 2],
                 "temperature": 0.0, "seed": 7, "order": "interleaved", "allow_different_files": True}, p
    purposes = {x["purpose"] for x in rec["prompts"]}
    assert {"warmup", "round-1-p8", "round-2-p8", "round-2-x2-2"} <= purposes, purposes
    assert all(len(x["sha256"]) == 64 for x in rec["prompts"]), rec["prompts"]
    by_engine = {e["engine"]: e for e in rec["engines"]}
    for e in by_engine.values():
        assert e["plugin_version"] and e["engine_version"], e
        assert e["settings"]["plugin"] == e["engine"], e["settings"]
    files = {f["name"]: f for f in by_engine["mlx-lm"]["model"]["files"]}
    assert files["config.json"]["hashed"] == "file" and len(files["config.json"]["sha256"]) == 64, files
    assert files["model.safetensors"]["hashed"] == "header", files
    assert files["tokenizer.json"]["hashed"] == "file", files
    assert by_engine["native-mlx"]["model"] == by_engine["mlx-lm"]["model"]
    (gguf,) = by_engine["llama-server"]["model"]["files"]
    assert gguf["name"] == "tiny-gguf.gguf" and gguf["hashed"] == "header" and gguf["size"] > 0, gguf


def test_markdown_and_svg_are_written(bench, record):
    md = (bench.tmp / "run.md").read_text()
    assert md.startswith("# hangar bench") and "| engine | model | load s |" in md, md
    assert "## Provenance" in md and "tiny-gguf.gguf" in md and "seed 7" in md, md
    svg = ET.parse(bench.tmp / "run.svg").getroot()
    assert svg.tag.endswith("svg"), svg.tag
    titles = [t.text for t in svg.iter("{http://www.w3.org/2000/svg}title")]
    assert any(t.startswith("llama-server on tiny-gguf decode @8") for t in titles), titles
    assert any(t.startswith("mlx-lm on tiny-llama cold @8") for t in titles), titles


def test_compare_marks_noise_and_lists_unmatched_engines(bench, record):
    r = bench(bench.llama, "--engines", "native-mlx", "--rounds", "1", *SMALL, "--compare", "run.json")
    assert r.returncode == 0, r.stderr
    assert "compared with run.json" in r.stdout, r.stdout
    assert "native-mlx on tiny-llama" in r.stdout and "decode tok/s @8" in r.stdout, r.stdout
    assert "mlx-lm on tiny-llama (only in run.json)" in r.stdout, r.stdout
    # A run measured otherwise is refused before anything is measured.
    r = bench(bench.llama, "--engines", "native-mlx", "--prompt-tokens", "8", "--gen-tokens", "5",
              "--concurrency", "1,2", "--compare", "run.json")
    assert r.returncode == 1 and "not comparable with run.json: it measured answers of 4 tokens, this run 5 tokens" in r.stderr, r.stderr
    r = bench(bench.llama, "--engines", "native-mlx", "--no-warmup", *SMALL, "--compare", "run.json")
    assert r.returncode == 1 and "one engine warm and another cold" in r.stderr, r.stderr


@pytest.mark.parametrize("args, message", [
    # Different files per engine, without the flag: refused, side by side.
    (["GGUF"], "not comparable: native-mlx on tiny-llama would read other model files than llama-server on tiny-gguf"),
    (["--no-warmup"], "without a warm-up the first engine would be measured cold"),
    (["--concurrency", "0"], "--concurrency takes whole numbers from 1 to 256"),
    (["--rounds", "0"], "'--rounds <ROUNDS>'"),
    (["--gen-tokens", "1"], "'--gen-tokens <GEN_TOKENS>'"),
    (["--engines", "nope"], "--engines: no plugin 'nope'"),
    (["--engines", "llama-server"], "--engines: 'llama-server' cannot serve any of the models"),
    (["--prompt-tokens", "8,8"], "--prompt-tokens lists a value twice"),
    (["--json-file", "no/such/dir/x.json"], "folder no/such/dir does not exist"),
    (["--compare", "missing.json"], "cannot read missing.json: No such file"),
    (["--compare", "run.md"], "--compare file run.md is not a hangar bench record"),
])
def test_bad_flags_and_incomparable_runs_are_refused_with_a_reason(bench, record, args, message):
    args = [bench.gguf if a == "GGUF" else a for a in args]
    r = bench(bench.llama, *args, timeout=30)
    assert r.returncode != 0 and message in r.stderr, r.stderr
