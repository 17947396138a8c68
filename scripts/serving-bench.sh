#!/usr/bin/env bash
# Serving benchmark through `hangar serve`: native-mlx against mlx_lm.server
# on the same random-weight model folder, in one run, rounds interleaved.
# Aggregate decode tokens/s and p50/p99 time to first token at 1, 8, 32 and
# 64 concurrent streaming chats; time to first token of a ~4000-token prompt
# cold, warm from memory and after a restart. See scripts/serving_bench.py.
#
# Usage: scripts/serving-bench.sh [smol|tiny] [serving_bench.py options...]
#   smol (default): SmolLM2-135M dimensions (hidden 576, 30 layers, 9 heads,
#   3 KV heads, intermediate 1536, vocab 49152), float32; tiny: the test shape.
# Env: BENCH_DIR (models, default /tmp/hangar-serving-bench), HANGAR_BIN (the
#   hangar binary; default: target/debug/hangar, built here).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$("$REPO/scripts/python-env.sh")"
BENCH_DIR="${BENCH_DIR:-/tmp/hangar-serving-bench}"
shape="${1:-smol}"
[[ $# -gt 0 ]] && shift

PLUGINS="$("$REPO/scripts/build-plugins.sh" | tail -1)"
if [[ -z "${HANGAR_BIN:-}" ]]; then
  (cd "$REPO" && cargo build --quiet -p hangar)
  HANGAR_BIN="$REPO/target/debug/hangar"
fi

model="$BENCH_DIR/$shape"
if [[ ! -f "$model/config.json" ]]; then
  case "$shape" in
    tiny) extra=() ;;
    smol) extra=(--hidden 576 --layers 30 --heads 9 --kv-heads 3 --intermediate 1536 --vocab 49152) ;;
    *) echo "unknown shape '$shape' (smol, tiny)" >&2; exit 2 ;;
  esac
  echo "serving-bench: making $model" >&2
  "$PY" "$REPO/scripts/make_tiny_model.py" "$model" --arch llama "${extra[@]}" >/dev/null
fi

exec "$PY" "$REPO/scripts/serving_bench.py" --hangar "$HANGAR_BIN" --plugins-dir "$PLUGINS" \
  --model "$model" --python "$PY" "$@"
