#!/usr/bin/env python3
"""Where a batched decoding step's time goes on MLX (CUDA or CPU), at the
dimensions of a model, with random weights (no model folder):

1. each projection's matmul at M rows (the M decoding rows of a step, and a
   prompt chunk), against the time to read its weights once;
2. one layer's decoding attention at B sequences of a padded context: MLX's
   fused vector kernel (no mask), the unfused path a mask forces, and a
   paged pool's read before it (a gather of rows first, as native-mlx read
   it once, and of heads first in 8-byte words, as KvPool::gather reads);
3. mlx-lm's whole decoding step at batch B: on a plain KVCache (every row
   the same length, no mask) and on the BatchKVCache its batch generator
   uses (left padding, a mask), pipelined as generate_step runs it.

Each figure is the median over --rounds of the mean over --iters calls
evaluated together (so launch overheads overlap as they do in a step).

Usage: mlx_step_profile.py [--shape qwen7] [--batches 1,8,64] [--context 256]
"""
import argparse
import statistics
import time

import mlx.core as mx
from mlx_lm.models import qwen2
from mlx_lm.models.cache import BatchKVCache, KVCache

SHAPES = {
    "qwen05": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                   num_key_value_heads=2, intermediate_size=4864, vocab_size=151936),
    "qwen7": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
                  num_key_value_heads=4, intermediate_size=18944, vocab_size=152064),
}


def timed(make, iters, rounds):
    """Median over rounds of the mean ms of `iters` results of `make()` evaluated together."""
    mx.eval([make() for _ in range(2)])
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        mx.eval([make() for _ in range(iters)])
        times.append((time.perf_counter() - start) * 1e3 / iters)
    return statistics.median(times), min(times), max(times)


def fmt(t):
    return f"{t[0]:8.3f} [{t[1]:.3f}-{t[2]:.3f}]"


def matmuls(dims, batches, iters, rounds):
    h, i, v = dims["hidden_size"], dims["intermediate_size"], dims["vocab_size"]
    d = h // dims["num_attention_heads"]
    kv = dims["num_key_value_heads"] * d
    shapes = {"qkv (fused)": (h + 2 * kv, h), "o": (h, h), "gate+up (fused)": (2 * i, h),
              "down": (h, i), "lm_head": (v, h)}
    bandwidth = None
    print("| projection | rows | ms | weight GB/s | TFLOP/s |")
    print("|---|---:|---:|---:|---:|")
    for name, (n, k) in shapes.items():
        w = mx.random.normal((n, k)).astype(mx.bfloat16)
        mx.eval(w)
        for m in batches + [512]:
            x = mx.random.normal((m, k)).astype(mx.bfloat16)
            t = timed(lambda: x @ w.T, iters, rounds)
            gbs = n * k * 2 / t[0] / 1e6
            bandwidth = max(bandwidth or 0, gbs)
            print(f"| {name} {n}x{k} | {m} | {fmt(t)} | {gbs:.0f} | {2 * m * n * k / t[0] / 1e9:.1f} |")
    print()


def attention(dims, batches, context, iters, rounds):
    heads, kv_heads = dims["num_attention_heads"], dims["num_key_value_heads"]
    d = dims["hidden_size"] // heads
    scale = d ** -0.5
    print(f"one layer's decoding attention, {heads} query heads, {kv_heads} kv heads, "
          f"padded context {context}, ms:\n")
    print("| sequences | vector kernel, no mask | masked (unfused) | pool gather, rows first "
          "| pool gather, heads first, 8-byte words |")
    print("|---:|---:|---:|---:|---:|")
    for b in batches:
        q = mx.random.normal((b, heads, 1, d)).astype(mx.bfloat16)
        k = mx.random.normal((b, kv_heads, context, d)).astype(mx.bfloat16)
        v = mx.random.normal((b, kv_heads, context, d)).astype(mx.bfloat16)
        lengths = mx.array([context - (j * 37) % (context // 2) for j in range(b)])
        mask = (mx.arange(context)[None, :] < lengths[:, None]).reshape(b, 1, 1, context)
        # A pool of twice the rows needed, read in 128-row pages in a
        # scattered order: rows first (take, then a transposed view, as
        # native-mlx read it before), and heads first as 8-byte words
        # (take_along_axis, contiguous output; native-mlx's KvPool::gather).
        rows = 2 * b * context
        pages = mx.array([(j * 7919) % (rows // 128) for j in range(b * context // 128)])
        index = (pages[:, None] * 128 + mx.arange(128)[None, :]).reshape(b, context)
        rows_k = mx.random.normal((rows, kv_heads, d)).astype(mx.bfloat16)
        rows_v = mx.random.normal((rows, kv_heads, d)).astype(mx.bfloat16)
        heads_k, heads_v = rows_k.transpose(1, 0, 2), rows_v.transpose(1, 0, 2)
        mx.eval(q, k, v, mask, rows_k, rows_v, heads_k, heads_v, index)
        flat = index.reshape(1, -1, 1)
        rep = heads // kv_heads
        q_heads = q.reshape(b, kv_heads, rep, d).transpose(1, 0, 2, 3).reshape(kv_heads * b, rep, 1, d)
        mask_heads = mx.broadcast_to(mask[None], (kv_heads, b, 1, 1, context)).reshape(
            kv_heads * b, 1, 1, context)
        mx.eval(q_heads, mask_heads, flat)
        plain = timed(lambda: mx.fast.scaled_dot_product_attention(q, k, v, scale=scale),
                      iters, rounds)
        masked = timed(lambda: mx.fast.scaled_dot_product_attention(
            q, k, v, scale=scale, mask=mask), iters, rounds)

        def rows_first():
            pk = mx.take(rows_k, index, axis=0).transpose(0, 2, 1, 3)
            pv = mx.take(rows_v, index, axis=0).transpose(0, 2, 1, 3)
            return mx.fast.scaled_dot_product_attention(q, pk, pv, scale=scale, mask=mask)

        def heads_first():
            def read(pool):
                words = mx.take_along_axis(pool.view(mx.uint64), flat, axis=1)
                return words.view(mx.bfloat16).reshape(-1, 1, context, d)
            return mx.fast.scaled_dot_product_attention(
                q_heads, read(heads_k), read(heads_v), scale=scale, mask=mask_heads)

        print(f"| {b} | {fmt(plain)} | {fmt(masked)} | {fmt(timed(rows_first, iters, rounds))} "
              f"| {fmt(timed(heads_first, iters, rounds))} |")
    print()


def model_steps(dims, batches, context, iters, rounds):
    args = qwen2.ModelArgs(model_type="qwen2", rms_norm_eps=1e-6, rope_theta=1e6,
                           tie_word_embeddings=False, **dims)
    model = qwen2.Model(args)
    model.set_dtype(mx.bfloat16)
    mx.eval(model.parameters())
    vocab = dims["vocab_size"]
    print(f"mlx-lm's decoding step, {context}-token prompts, ms per step (pipelined):\n")
    print("| batch | KVCache, no mask | BatchKVCache, left-padded |")
    print("|---:|---:|---:|")
    for b in batches:
        cells = []
        for batched in (False, True):
            if batched:
                cache = [BatchKVCache([j % 8 for j in range(b)]) for _ in model.layers]
            else:
                cache = [KVCache() for _ in model.layers]
            prompt = (mx.arange(b * context).reshape(b, context) * 7919) % vocab
            mx.eval(model(prompt, cache=cache))
            y = mx.zeros((b, 1), dtype=mx.uint32)

            def step(y):
                return mx.argmax(model(y, cache=cache)[:, -1, :], axis=-1, keepdims=True)

            times = []
            for _ in range(rounds):
                y = step(y)
                mx.async_eval(y)
                start = time.perf_counter()
                for _ in range(iters):
                    nxt = step(y)
                    mx.async_eval(nxt)
                    mx.eval(y)
                    y = nxt
                mx.eval(y)
                times.append((time.perf_counter() - start) * 1e3 / iters)
            cells.append(fmt((statistics.median(times), min(times), max(times))))
        print(f"| {b} | {cells[0]} | {cells[1]} |")
    print()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen7")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--skip-model", action="store_true")
    ap.add_argument("--skip-matmuls", action="store_true")
    args = ap.parse_args()
    dims = SHAPES[args.shape]
    batches = [int(b) for b in args.batches.split(",")]
    print(f"MLX {mx.__version__} on {mx.default_device()}, {args.shape}, bfloat16\n")
    if not args.skip_matmuls:
        matmuls(dims, batches, args.iters, args.rounds)
    attention(dims, batches, args.context, args.iters, args.rounds)
    if not args.skip_model:
        model_steps(dims, batches, args.context // 2, args.iters, args.rounds)


if __name__ == "__main__":
    main()
