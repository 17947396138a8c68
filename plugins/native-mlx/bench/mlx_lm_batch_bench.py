#!/usr/bin/env python3
"""mlx-lm's batched generation (`batch_generate`, what mlx_lm.server batches with)
on N prompts at once: aggregate tokens/s per run, the counterpart of
`native-mlx-bench --concurrent N` (same prompt ids: `prompt(len, vocab)` of the
bench binary with a distinct first and second id per request and run).

Usage: mlx_lm_batch_bench.py MODEL --concurrent N [--prompt-tokens 128]
       [--gen-tokens 128] [--runs 3]
"""
import argparse
import time

from mlx_lm import load
from mlx_lm.generate import batch_generate


def prompt(n, vocab):
    return [(i * 7919 + 13) % vocab for i in range(n)]


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
        out = batch_generate(model, tokenizer, prompts, max_tokens=args.gen_tokens,
                             return_token_ids=True)
        wall = time.perf_counter() - start
        tokens = sum(len(t) for t in out.token_ids) if getattr(out, "token_ids", None) else \
            args.concurrent * args.gen_tokens
        print(f"{args.model} x{args.concurrent} run {run}{' (warm-up)' if run == 0 else ''}: "
              f"{tokens / wall:.1f} tok/s aggregate ({tokens} tokens in {wall:.2f} s)")


if __name__ == "__main__":
    main()
