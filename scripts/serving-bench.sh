#!/usr/bin/env bash
# Serving benchmark through `hangar serve`: native-mlx against mlx_lm.server
# on the same random-weight model folder, in one run, rounds interleaved.
# Aggregate decode tokens/s and p50/p99 time to first token at 1, 8, 32 and
# 64 concurrent streaming chats; time to first token of a ~4000-token prompt
# cold, warm from memory and after a restart. See scripts/serving_bench.py.
#
# Usage: scripts/serving-bench.sh [smol|tiny|qwen05|qwen7] [serving_bench.py options...]
#   smol (default): SmolLM2-135M dimensions (hidden 576, 30 layers, 9 heads,
#   3 KV heads, intermediate 1536, vocab 49152), float32; tiny: the test
#   shape; qwen05, qwen7: Qwen2.5-0.5B and 7B dimensions, bfloat16 (for a
#   GPU, as scripts/gpu-bench.sh).
# Env: BENCH_DIR (models, default /tmp/hangar-serving-bench), HANGAR_BIN (the
#   hangar binary; default: target/release/hangar, built here), PYTHON (an
#   interpreter with mlx, mlx-lm and the openai client; default: the venv
#   of scripts/python-env.sh), PLUGINS_DIR (a plugins folder; default: the
#   one scripts/build-plugins.sh builds). With all three set nothing is
#   built or installed: a machine without Rust or a package index.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-}"
[[ -n "$PY" ]] || PY="$("$REPO/scripts/python-env.sh")"
BENCH_DIR="${BENCH_DIR:-/tmp/hangar-serving-bench}"
shape="${1:-smol}"
[[ $# -gt 0 ]] && shift

# Release builds, as operators run them (scripts/demo.sh): a debug host's
# request path (JSON and SSE per token, in the host and the worker) is
# several times slower and, at many streams, it is what gets measured.
PLUGINS="${PLUGINS_DIR:-}"
[[ -n "$PLUGINS" ]] || PLUGINS="$("$REPO/scripts/build-plugins.sh" --release | tail -1)"
if [[ -z "${HANGAR_BIN:-}" ]]; then
  (cd "$REPO" && cargo build --quiet --release -p hangar)
  HANGAR_BIN="$REPO/target/release/hangar"
fi

model="$BENCH_DIR/$shape"
if [[ ! -f "$model/config.json" ]]; then
  case "$shape" in
    tiny) extra=(--arch llama) ;;
    smol) extra=(--arch llama --hidden 576 --layers 30 --heads 9 --kv-heads 3 --intermediate 1536 --vocab 49152) ;;
    qwen05) extra=(--bench --arch qwen2 --dtype bfloat16 --hidden 896 --layers 24 --heads 14 --kv-heads 2
      --intermediate 4864 --vocab 151936) ;;
    qwen7) extra=(--bench --arch qwen2 --dtype bfloat16 --hidden 3584 --layers 28 --heads 28 --kv-heads 4
      --intermediate 18944 --vocab 152064) ;;
    *) echo "unknown shape '$shape' (smol, tiny, qwen05, qwen7)" >&2; exit 2 ;;
  esac
  echo "serving-bench: making $model" >&2
  rm -rf "$model.part"
  "$PY" "$REPO/scripts/make_tiny_model.py" "$model.part" "${extra[@]}" >/dev/null
  mv "$model.part" "$model"
fi

exec "$PY" "$REPO/scripts/serving_bench.py" --hangar "$HANGAR_BIN" --plugins-dir "$PLUGINS" \
  --model "$model" --python "$PY" "$@"
