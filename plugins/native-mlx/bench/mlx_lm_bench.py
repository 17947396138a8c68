#!/usr/bin/env python3
"""Measures mlx-lm the way native-mlx-bench measures native-mlx (the Python half of scripts/native-mlx-bench.sh).

Same prompt ids, same counts, one warm-up then --runs timed runs of
mlx_lm.stream_generate with end-of-sequence ignored; speeds are
stream_generate's own prompt_tps and generation_tps. Prints one JSON object.
"""
import argparse
import json
import resource
import time

import mlx.core as mx
from mlx_lm import load, stream_generate


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()

    started = time.perf_counter()
    model, tokenizer, config = load(a.model, return_config=True)
    load_s = time.perf_counter() - started
    tokenizer._eos_token_ids = set()  # as mlx_lm.benchmark: never stop early
    vocab = config["vocab_size"]
    prompt = [(i * 7919 + 13) % vocab for i in range(a.prompt_tokens)]

    totals = {"prompt_tps": 0.0, "decode_tps": 0.0, "ttft_ms": 0.0}
    for run in range(a.runs + 1):
        for last in stream_generate(model, tokenizer, prompt, max_tokens=a.gen_tokens):
            pass
        if run == 0:
            continue  # warm-up
        assert last.generation_tokens == a.gen_tokens, last.generation_tokens
        totals["prompt_tps"] += last.prompt_tps
        totals["decode_tps"] += last.generation_tps
        totals["ttft_ms"] += 1e3 * last.prompt_tokens / last.prompt_tps
    result = {k: v / a.runs for k, v in totals.items()}
    result.update(
        engine="mlx-lm",
        model=a.model,
        device=str(mx.default_device()).split("(")[1].split(",")[0],
        prompt_tokens=a.prompt_tokens,
        gen_tokens=a.gen_tokens,
        peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        load_s=load_s,
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
