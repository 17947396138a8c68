#!/usr/bin/env python3
"""mlx-lm's batched generation (`BatchGenerator`, what mlx_lm.server batches with,
driven as `batch_generate` drives it) on N prompts at once: aggregate tokens/s
and p50/p99 time to first token per run, the counterpart of
`native-mlx-bench --concurrent N` (same prompt ids: `prompt(len, vocab)` of the
bench binary with a distinct first and second id per request and run).

Usage: mlx_lm_batch_bench.py MODEL --concurrent N [--prompt-tokens 128]
       [--gen-tokens 128] [--runs 3]
"""
import argparse
import time

from mlx_lm import load
from mlx_lm.generate import BatchGenerator


def prompt(n, vocab):
    return [(i * 7919 + 13) % vocab for i in range(n)]


def percentile(values, p):
    """The nearest-rank percentile (as native-mlx-bench computes it)."""
    values = sorted(values)
    return values[min(len(values) - 1, max(0, -(-p * len(values) // 100) - 1))]


def run_batch(model, tokenizer, prompts, max_tokens):
    """All prompts at once through a BatchGenerator, as batch_generate runs them:
    (tokens generated, seconds to each request's first token)."""
    start = time.perf_counter()
    gen = BatchGenerator(model, stop_tokens=[[t] for t in tokenizer.eos_token_ids])
    uids = gen.insert(prompts, [max_tokens] * len(prompts))
    first, tokens = {}, 0
    while responses := gen.next_generated():
        now = time.perf_counter()
        for r in responses:
            first.setdefault(r.uid, now - start)
            if r.finish_reason != "stop":
                tokens += 1
    gen.close()
    return tokens, [first[uid] for uid in uids]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--concurrent", type=int, required=True)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    model, tokenizer = load(args.model)
    vocab = model.args.vocab_size
    for run in range(args.runs + 1):
        prompts = []
        for i in range(args.concurrent):
            ids = prompt(args.prompt_tokens, vocab)
            ids[0] = (i * 31 + 7) % vocab
            ids[1] = (run * 17 + 3) % vocab
            prompts.append(ids)
        start = time.perf_counter()
        # Every request runs to max_tokens: random weights rarely pick an EOS id.
        tokens, ttfts = run_batch(model, tokenizer, prompts, args.gen_tokens)
        wall = time.perf_counter() - start
        print(f"{args.model} x{args.concurrent} run {run}{' (warm-up)' if run == 0 else ''}: "
              f"{tokens / wall:.1f} tok/s aggregate ({tokens} tokens in {wall:.2f} s, "
              f"ttft p50 {percentile(ttfts, 50) * 1000:.1f} ms p99 {percentile(ttfts, 99) * 1000:.1f} ms)")


if __name__ == "__main__":
    main()
