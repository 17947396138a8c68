#!/usr/bin/env python3
"""Greedy (or seeded) token ids from mlx-lm, the reference native-mlx must match.

Reads a JSON request on stdin and prints a JSON list on stdout, one entry per
case: {"model": DIR, "prompt": [ids], "max_tokens": N, "temp": 0.0,
"top_p": 0.0, "top_k": 0, "min_p": 0.0, "seed": 0}. Unset sampling fields
mean greedy. Token ids go in and come out, so no tokenizer or chat template
takes part in the comparison. mlx_lm's `generate_step` does not stop at EOS,
which is what a fixed-length comparison needs.
"""
import json
import sys

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler


def run(case, models):
    path = case["model"]
    if path not in models:
        models[path] = load(path)[0]
    model = models[path]
    mx.random.seed(case.get("seed", 0))
    sampler = make_sampler(
        temp=case.get("temp", 0.0),
        top_p=case.get("top_p", 0.0),
        min_p=case.get("min_p", 0.0),
        top_k=case.get("top_k", 0),
    )
    prompt = mx.array(case["prompt"], dtype=mx.uint32)
    steps = generate_step(prompt, model, max_tokens=case["max_tokens"], sampler=sampler)
    return [token for token, _ in steps]


def main():
    cases = json.load(sys.stdin)
    models = {}
    json.dump([run(case, models) for case in cases], sys.stdout)
    print()


if __name__ == "__main__":
    main()
