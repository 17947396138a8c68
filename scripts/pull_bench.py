#!/usr/bin/env python3
"""`hangar pull` against `curl` fetching the same files from the hub stand-in
(tests/stand-ins/hub_server.py) on loopback, plus the cost of a resume.

    python3 scripts/pull_bench.py [--hangar target/release/hangar] [--baseline OTHER_HANGAR]
        [--mb 300] [--files 4] [--rounds 5]

Writes FILES random files (MB in all) as repository bench/files, starts the
stand-in, and per round, in alternating order (so that neither always runs
on a warmer page cache), times:
- `hangar pull bench/files --force` into an empty cache;
- `curl -sfL` fetching the same `resolve` URLs (following the redirect to
  the CDN path, as the pull does), one after another in one process;
- a resumed pull: a stand-in that breaks every file off at its half, the
  pull that fails there, then the pull that finishes it; its overhead is
  (both pulls) / (a clean pull) - 1.
With `--baseline`, a second `hangar` binary (an older build, say) is timed
the same way in the same rounds, for a before/after comparison.
Prints medians with their spread [min-max], and the pull rate as a fraction
of curl's (issue 32's target: >= 0.9), both of the medians and as the median
of each round's own ratio.
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
    p.add_argument("--baseline", help="another hangar binary, timed in the same rounds")
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

        def pull(binary: str, endpoint: str, cache: Path, check=True) -> float:
            env = dict(base, HF_ENDPOINT=endpoint, HF_HUB_CACHE=str(cache))
            return timed([binary, "pull", "bench/files", "--force"], env, check)

        def curl(out: Path) -> float:
            out.mkdir()
            cmd = ["curl", "-sfL"]
            for i, u in enumerate(urls):
                cmd += ["-o", str(out / f"{i}"), u]
            return timed(cmd, base)

        binaries = {"hangar pull": a.hangar}
        if a.baseline:
            binaries["baseline pull"] = a.baseline
        rows = {"curl": []}
        for name in binaries:
            rows[name] = []
            rows[f"{name}: broken at 1/2 + resume"] = []
        for r in range(a.rounds):
            # Alternating order, so that none always runs on a warmer page cache.
            order = ["curl", *binaries]
            order = order if r % 2 == 0 else order[::-1]
            for what in order:
                target = work / f"{what.replace(' ', '-')}-{r}"
                rows[what].append(curl(target) if what == "curl" else pull(binaries[what], url, target))
                shutil.rmtree(target)
            for name in order:
                if name == "curl":
                    continue
                # A resume: a fresh broken stand-in breaks each file once, at its half.
                broken.kill()
                broken.wait()
                broken, broken_url = start_hub(work / "repos", "--break-after", half)
                target = work / f"resume-{r}"
                first = pull(binaries[name], broken_url, target, check=False)
                second = pull(binaries[name], broken_url, target)
                rows[f"{name}: broken at 1/2 + resume"].append(first + second)
                shutil.rmtree(target)
        med = {k: statistics.median(v) for k, v in rows.items()}
        mib = total / (1 << 20)
        print(f"{a.files} files, {mib:.0f} MiB, {a.rounds} interleaved rounds, loopback; "
              "median seconds [min-max]")
        print(f"{'what':<40}{'seconds':>10}{'spread':>18}{'MiB/s':>8}")
        for k, v in rows.items():
            spread = f"[{min(v):.3f}-{max(v):.3f}]"
            label = "curl -sfL (sequential)" if k == "curl" else k
            print(f"{label:<40}{med[k]:>10.3f}{spread:>18}{mib / med[k]:>8.0f}")
        for name in binaries:
            ratios = [c / p for c, p in zip(rows["curl"], rows[name])]
            resumes = [x / p - 1 for x, p in zip(rows[f"{name}: broken at 1/2 + resume"], rows[name])]
            print(f"{name}: rate / curl rate {med['curl'] / med[name]:.2f}x of the medians, "
                  f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}] per round "
                  "(target >= 0.9x)")
            print(f"{name}: resume overhead (break + resume vs one clean pull) "
                  f"{med[f'{name}: broken at 1/2 + resume'] / med[name] - 1:+.0%} of the medians, "
                  f"{statistics.median(resumes):+.0%} [{min(resumes):+.0%} to {max(resumes):+.0%}] per round")
        hub.kill()
        broken.kill()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
