#!/usr/bin/env python3
"""mlx-lm's own greedy ids of the bench prompt three ways, to tell an engine's
bug from a kernel-order difference (scripts/gpu-bench.sh's ids check):

- "alone": `generate_step`, one sequence (what mlx_lm.generate runs);
- "batch_of_one": `batch_generate` with this prompt only;
- "batched": `batch_generate` with this prompt first and COMPANY - 1 others
  (the bench prompt with a different first id each), as mlx_lm.server batches.

Prints one JSON object: {"alone": [...], "batch_of_one": [...], "batched": [...]}.
Usage: mlx_lm_ids.py MODEL --prompt-tokens N [--gen-tokens 64] [--company 8]
"""
import argparse
import json

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import batch_generate, generate_step


def prompt(n, vocab):
    """The bench binary's prompt ids (native-mlx-bench's `prompt`)."""
    return [(i * 7919 + 13) % vocab for i in range(n)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prompt-tokens", type=int, required=True)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--company", type=int, default=8)
    args = ap.parse_args()
    model, tokenizer = load(args.model)
    vocab = model.args.vocab_size
    ids = prompt(args.prompt_tokens, vocab)
    steps = generate_step(mx.array(ids, dtype=mx.uint32), model, max_tokens=args.gen_tokens)
    alone = [int(token) for token, _ in steps]

    def batched(prompts):
        out = batch_generate(model, tokenizer, prompts, max_tokens=args.gen_tokens,
                             return_token_ids=True)
        return [int(t) for t in out.token_ids[0]]

    others = []
    for i in range(1, args.company):
        other = list(ids)
        other[0] = (i * 31 + 7) % vocab
        others.append(other)
    print(json.dumps({"alone": alone, "batch_of_one": batched([ids]),
                      "batched": batched([ids] + others)}))


if __name__ == "__main__":
    main()
