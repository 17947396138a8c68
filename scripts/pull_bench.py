#!/usr/bin/env python3
"""`hangar pull` against `curl` fetching the same files from the hub stand-in
(tests/stand-ins/hub_server.py) on loopback, plus the cost of a resume.

    python3 scripts/pull_bench.py [--hangar target/release/hangar] [--mb 300] [--files 4] [--rounds 5]

Writes FILES random files (MB in all) as repository bench/files, starts the
stand-in, and per round, in alternating order (so that neither always runs
on a warmer page cache), times:
- `hangar pull bench/files --force` into an empty cache;
- `curl -sfL` fetching the same `resolve` URLs (following the redirect to
  the CDN path, as the pull does), one after another in one process;
- a resumed pull: a stand-in that breaks every file off at its half, the
  pull that fails there, then the pull that finishes it; its overhead is
  (both pulls) / (a clean pull) - 1.
Prints medians and the pull rate as a fraction of curl's (issue 32's target: >= 0.9).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HUB = REPO / "tests" / "stand-ins" / "hub_server.py"


def start_hub(repos: Path, *flags: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, str(HUB), "--repos", str(repos), *flags],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    return proc, line.split("listening on ", 1)[1].strip()


def timed(cmd: list[str], env: dict, check: bool = True) -> float:
    start = time.perf_counter()
    r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    took = time.perf_counter() - start
    if check and r.returncode != 0:
        raise SystemExit(f"{cmd[:3]} failed: {r.stderr}")
    return took


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hangar", default=str(REPO / "target" / "release" / "hangar"))
    p.add_argument("--mb", type=int, default=300)
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pull-bench-"))
    try:
        files = work / "repos" / "bench" / "files"
        files.mkdir(parents=True)
        each = a.mb * (1 << 20) // a.files
        for i in range(a.files):
            (files / f"part-{i}.bin").write_bytes(os.urandom(each))
        total = each * a.files
        hub, url = start_hub(work / "repos")
        half = str(each // 2)
        broken, broken_url = start_hub(work / "repos", "--break-after", half)
        info = json.load(urllib.request.urlopen(f"{url}/api/models/bench/files/revision/main?blobs=true"))
        urls = [f"{url}/bench/files/resolve/{info['sha']}/{s['rfilename']}" for s in info["siblings"]]
        base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HANGAR_"))}

        def pull(endpoint: str, cache: Path, check=True) -> float:
            env = dict(base, HF_ENDPOINT=endpoint, HF_HUB_CACHE=str(cache))
            return timed([a.hangar, "pull", "bench/files", "--force"], env, check)

        def curl(out: Path) -> float:
            out.mkdir()
            cmd = ["curl", "-sfL"]
            for i, u in enumerate(urls):
                cmd += ["-o", str(out / f"{i}"), u]
            return timed(cmd, base)

        rows = {"pull": [], "curl": [], "resume": []}
        for r in range(a.rounds):
            order = ["pull", "curl"] if r % 2 == 0 else ["curl", "pull"]
            for what in order:
                target = work / f"{what}-{r}"
                rows[what].append(pull(url, target) if what == "pull" else curl(target))
                shutil.rmtree(target)
            # A resume: the broken stand-in breaks each file once, at its half.
            broken.kill()
            broken.wait()
            broken, broken_url = start_hub(work / "repos", "--break-after", half)
            target = work / f"resume-{r}"
            first = pull(broken_url, target, check=False)
            second = pull(broken_url, target)
            rows["resume"].append(first + second)
            shutil.rmtree(target)
        med = {k: statistics.median(v) for k, v in rows.items()}
        mib = total / (1 << 20)
        print(f"{a.files} files, {mib:.0f} MiB, {a.rounds} interleaved rounds, loopback, medians")
        print(f"{'what':<28}{'seconds':>10}{'MiB/s':>10}")
        print(f"{'curl -sfL (sequential)':<28}{med['curl']:>10.3f}{mib / med['curl']:>10.0f}")
        print(f"{'hangar pull':<28}{med['pull']:>10.3f}{mib / med['pull']:>10.0f}")
        print(f"{'pull broken at 1/2 + resume':<28}{med['resume']:>10.3f}{mib / med['resume']:>10.0f}")
        print(f"pull rate / curl rate: {med['curl'] / med['pull']:.2f}x (target >= 0.9x)")
        print(f"resume overhead (break + resume vs one clean pull): {med['resume'] / med['pull'] - 1:+.0%}")
        hub.kill()
        broken.kill()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
