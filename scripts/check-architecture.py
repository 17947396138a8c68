#!/usr/bin/env python3
"""Checks the one-way structure DESIGN.md promises, and fails naming what breaks it.

1. The test kit, and the engine library without its `wasm` feature, link no
   HTTP stack (axum, hyper, reqwest, tokio): a plugin's tests never compile
   the server.
2. Within each host crate, imports between top-level modules run one way:
   no module imports the CLI (except the binary's entry point) and the
   module graph has no cycle (`a` imports `b` and `b` imports `a`, directly
   or through others).

Run from anywhere: `scripts/check-architecture.py`. Exit 1 on a violation.
"""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVER_ONLY = ("axum", "hyper", "reqwest", "tokio")
problems = []


def tree(package, *flags):
    out = subprocess.run(
        ["cargo", "tree", "-p", package, "-e", "normal", "--prefix", "none", *flags],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


for package, flags in (("hangar-sdk-testkit", ()), ("hangar-engine", ("--no-default-features",))):
    leaked = sorted(c for c in tree(package, *flags) if c in SERVER_ONLY)
    if leaked:
        problems.append(f"{package} {' '.join(flags)} depends on {', '.join(leaked)}: "
                        "plugins' tests must not compile the server")


def module_of(src, path):
    rel = path.relative_to(src)
    return rel.parts[0].removesuffix(".rs")


for crate in ("host/engine", "host/server"):
    src = ROOT / crate / "src"
    edges = {}
    for path in src.rglob("*.rs"):
        module = module_of(src, path)
        if module in ("lib", "main"):
            continue
        # Doc links are not imports.
        text = "\n".join(l for l in path.read_text().splitlines() if not l.lstrip().startswith("//"))
        for used in set(re.findall(r"\bcrate::([a-z_]+)", text)):
            if used != module:
                edges.setdefault(module, set()).add(used)
    for module, used in sorted(edges.items()):
        if "cli" in used and module != "cli":
            problems.append(f"{crate}: {module} imports the CLI; move what it needs below the CLI")

    # Cycles: a depth-first search over the module graph.
    state = {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                cycle = stack[stack.index(nxt):] + [nxt]
                problems.append(f"{crate}: modules import each other: {' -> '.join(cycle)}")
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])

if problems:
    print("architecture check failed:", *problems, sep="\n- ")
    sys.exit(1)
print("architecture check: the test kit links no server; imports run one way")
