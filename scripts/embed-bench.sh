#!/usr/bin/env bash
# Embeddings per second, native-mlx against fastembed and ONNX Runtime (the
# CPU baselines), on the same random-weight BERT in one run, rounds
# interleaved (native, fastembed, onnxruntime; again): inputs of TOKENS
# tokens, batches of BATCHES. Each engine prints its own per-round lines
# (native-mlx-bench --embed: median and min-max over RUNS calls;
# embed_baselines.py: JSON lines, median of RUNS calls). Then the host's
# added latency on a one-input request: `hangar serve` (HANGAR_BIN, default
# target/debug/hangar, built here) against the engine alone on the same
# input, LATENCY_RUNS requests each, rounds interleaved
# (bench/embed_latency.py).
#
# Usage: scripts/embed-bench.sh [tiny|base]   (default: tiny; base is
#        bge-small's dimensions: hidden 384, 12 layers)
# Env: BENCH_DIR (default /tmp/hangar-embed-bench), ROUNDS (3), RUNS (3),
#      BATCHES (1,32,256), TOKENS (64), LATENCY_RUNS (50), HANGAR_BIN.
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

LATENCY_RUNS="${LATENCY_RUNS:-50}"
PLUGINS="$("$REPO/scripts/build-plugins.sh" | tail -1)"
if [[ -z "${HANGAR_BIN:-}" ]]; then
  (cd "$REPO" && cargo build --quiet -p hangar)
  HANGAR_BIN="$REPO/target/debug/hangar"
fi
echo "== one input of $TOKENS tokens: ms per request (median, min-max over $LATENCY_RUNS)"
for round in $(seq "$ROUNDS"); do
  "$BENCH" --embed 1 --embed-tokens "$TOKENS" --runs "$LATENCY_RUNS" "$MODEL" 2>/dev/null | tail -n 1 |
    awk -v r="$round" '{ printf "round %s  engine alone     %8.2f\n", r, $4 }'
  "$PY" "$REPO/plugins/native-mlx/bench/embed_latency.py" "$MODEL" --hangar "$HANGAR_BIN" \
    --plugins-dir "$PLUGINS" --tokens "$TOKENS" --runs "$LATENCY_RUNS" |
    "$PY" -c 'import json, sys
d = json.load(sys.stdin)
print("round %s  through hangar  %8.2f  (%.2f-%.2f, p90 %.2f)" % (sys.argv[1], d["median_ms"], d["min_ms"], d["max_ms"], d["p90_ms"]))' "$round"
done
