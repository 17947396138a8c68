#!/usr/bin/env bash
# Embeddings per second, native-mlx against fastembed and ONNX Runtime (the
# CPU baselines), on the same random-weight BERT in one run, rounds
# interleaved (native, fastembed, onnxruntime; again): inputs of TOKENS
# tokens, batches of BATCHES. Each engine prints its own per-round lines
# (native-mlx-bench --embed: median and min-max over RUNS calls;
# embed_baselines.py: JSON lines, median of RUNS calls).
#
# Usage: scripts/embed-bench.sh [tiny|base]   (default: tiny; base is
#        bge-small's dimensions: hidden 384, 12 layers)
# Env: BENCH_DIR (default /tmp/hangar-embed-bench), ROUNDS (3), RUNS (3),
#      BATCHES (1,32,256), TOKENS (64).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$("$REPO/scripts/python-env.sh" engines bench)"
"$REPO/scripts/native-mlx-prepare.sh"
SIZE="${1:-tiny}"
BENCH_DIR="${BENCH_DIR:-/tmp/hangar-embed-bench}"
ROUNDS="${ROUNDS:-3}" RUNS="${RUNS:-3}" BATCHES="${BATCHES:-1,32,256}" TOKENS="${TOKENS:-64}"

(cd "$REPO/plugins/native-mlx" && cargo build --quiet --release --bin native-mlx-bench)
BENCH="$REPO/plugins/native-mlx/target/release/native-mlx-bench"
MODEL="$BENCH_DIR/bert-$SIZE" ONNX="$BENCH_DIR/bert-$SIZE-onnx"
[[ -f "$MODEL/config.json" ]] || "$PY" "$REPO/scripts/make_tiny_embedder.py" bert "$MODEL" --size "$SIZE" >/dev/null
[[ -f "$ONNX/onnx/model.onnx" ]] || "$PY" "$REPO/plugins/native-mlx/bench/bert_onnx.py" "$MODEL" "$ONNX" >/dev/null

for round in $(seq "$ROUNDS"); do
  echo "== round $round: native-mlx"
  "$BENCH" --embed "$BATCHES" --embed-tokens "$TOKENS" --runs "$RUNS" "$MODEL" 2>/dev/null | tail -n +2
  for engine in fastembed onnxruntime; do
    echo "== round $round: $engine"
    "$PY" "$REPO/plugins/native-mlx/bench/embed_baselines.py" "$engine" "$MODEL" "$ONNX" \
      --batches "$BATCHES" --tokens "$TOKENS" --repeat "$RUNS" 2>/dev/null |
      "$PY" -c 'import json, sys
for d in map(json.loads, sys.stdin):
    print("%8d %14.1f" % (d["batch"], d["per_second"]))'
  done
done
