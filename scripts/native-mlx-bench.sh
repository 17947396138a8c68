#!/usr/bin/env bash
# Benchmarks native-mlx against mlx-lm on the same random-weight models, in one run.
#
# Models (made once under $BENCH_DIR, default /tmp/hangar-native-mlx-bench):
#   tiny   the test shape (hidden 64, 2 layers, vocab 512): per-token overhead dominates
#   smol   SmolLM2-135M dimensions (hidden 576, 30 layers, 9 heads, 3 KV heads,
#          intermediate 1536, vocab 49152)
# each in float32 and MLX 4-bit. Both engines get the same prompt ids and
# token counts, end-of-sequence ignored, one warm-up then timed runs, and
# each model runs in a fresh process (peak RSS is per process).
# Prints a markdown table: prompt tok/s, decode tok/s, time to first token,
# peak RSS, and native-mlx / mlx-lm ratios.
#
# Usage: scripts/native-mlx-bench.sh [tiny|smol ...]   (default: tiny smol)
# Env: BENCH_DIR, RUNS (timed runs, default 3), PROMPT_TOKENS (128),
#      TINY_GEN_TOKENS (128), SMOL_GEN_TOKENS (64).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$("$REPO/scripts/python-env.sh")"
"$REPO/scripts/native-mlx-prepare.sh"
BENCH_DIR="${BENCH_DIR:-/tmp/hangar-native-mlx-bench}"
RUNS="${RUNS:-3}"
PROMPT_TOKENS="${PROMPT_TOKENS:-128}"
SHAPES=("$@")
[[ ${#SHAPES[@]} -gt 0 ]] || SHAPES=(tiny smol)

echo "native-mlx-bench: building the bench binary" >&2
(cd "$REPO/plugins/native-mlx" && cargo build --quiet --release --bin native-mlx-bench)
BENCH="$REPO/plugins/native-mlx/target/release/native-mlx-bench"

make_model() { # name, make_tiny_model.py arguments...
  local dir="$BENCH_DIR/$1"; shift
  if [[ ! -f "$dir/config.json" ]]; then
    echo "native-mlx-bench: making $dir" >&2
    "$PY" "$REPO/scripts/make_tiny_model.py" "$dir" "$@" >/dev/null
  fi
  if [[ ! -f "$dir-q4/config.json" ]]; then
    echo "native-mlx-bench: quantizing $dir-q4" >&2
    "$PY" -m mlx_lm convert --hf-path "$dir" --mlx-path "$dir-q4" -q --q-bits 4 >/dev/null 2>&1
  fi
}

RESULTS="$(mktemp)"
trap 'rm -f "$RESULTS"' EXIT
for shape in "${SHAPES[@]}"; do
  case "$shape" in
    tiny) make_model tiny --arch llama; gen="${TINY_GEN_TOKENS:-128}" ;;
    smol) make_model smol --arch llama --hidden 576 --layers 30 --heads 9 --kv-heads 3 \
            --intermediate 1536 --vocab 49152; gen="${SMOL_GEN_TOKENS:-64}" ;;
    *) echo "unknown shape '$shape' (tiny, smol)" >&2; exit 2 ;;
  esac
  for model in "$BENCH_DIR/$shape" "$BENCH_DIR/$shape-q4"; do
    args=(--prompt-tokens "$PROMPT_TOKENS" --gen-tokens "$gen" --runs "$RUNS")
    echo "native-mlx-bench: $model: native-mlx" >&2
    "$BENCH" --json "${args[@]}" "$model" >> "$RESULTS"
    echo "native-mlx-bench: $model: mlx-lm" >&2
    "$PY" "$REPO/plugins/native-mlx/bench/mlx_lm_bench.py" "${args[@]}" "$model" >> "$RESULTS"
  done
done

"$PY" - "$RESULTS" <<'PYTHON'
import json, os, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r["model"], {})[r["engine"]] = r
print(f"device: {rows[0]['device']}, prompt {rows[0]['prompt_tokens']} tokens, mean of timed runs\n")
print("| model | engine | prompt tok/s | decode tok/s | TTFT ms | peak RSS MiB |")
print("|---|---|---:|---:|---:|---:|")
for model, engines in by.items():
    name = f"{os.path.basename(model)} ({engines['native-mlx']['gen_tokens']} gen)"
    for engine in ("native-mlx", "mlx-lm"):
        r = engines[engine]
        print(f"| {name} | {engine} | {r['prompt_tps']:.1f} | {r['decode_tps']:.1f} | {r['ttft_ms']:.1f} | {r['peak_rss_mib']:.0f} |")
    n, m = engines["native-mlx"], engines["mlx-lm"]
    print(f"| {name} | **ratio** | **{n['prompt_tps'] / m['prompt_tps']:.2f}x** | **{n['decode_tps'] / m['decode_tps']:.2f}x** "
          f"| {n['ttft_ms'] / m['ttft_ms']:.2f}x | {n['peak_rss_mib'] / m['peak_rss_mib']:.2f}x |")
PYTHON
