#!/usr/bin/env bash
# native-mlx against mlx-lm on a GPU (MLX's CUDA build), engine level (no
# HTTP): greedy ids of both engines compared, single-stream decode, and
# aggregate tokens/s at several concurrent streams (native-mlx's batcher
# against mlx-lm's batch_generate, what mlx_lm.server batches with). Every
# measurement runs in a fresh process; rounds interleave the engines
# (A B A B ...); the table gives medians with min-max. A run that fails is
# recorded without a figure ("no result") and the rest goes on.
#
# It builds nothing: it runs where Rust is absent (a lent GPU machine).
# scripts/gpu-prepare.sh builds the bench binary where Rust is, against MLX's
# CUDA wheel, and lays it out with the wheels for carrying;
# scripts/gpu-device.sh installs them on the GPU machine.
#
# Usage: scripts/gpu-bench.sh BENCH_BINARY [SHAPE...]   (default: qwen05)
#   qwen05  Qwen2.5-0.5B dimensions, bfloat16
#   qwen7   Qwen2.5-7B dimensions, bfloat16 (about 15 GB of random weights)
#   tiny    the test shape, float32: a dry run of the script on a CPU
#   SHAPE-q4  (qwen05-q4, qwen7-q4, tiny-q4) that model quantized to 4 bits
#           by mlx-lm's convert (group size 64), which both engines load
#   moe30   Qwen3-30B-A3B dimensions (128 experts, 8 a token), 4-bit
#   gptoss20  gpt-oss-20b dimensions (32 experts, 4 a token, sliding and
#           full layers), 4-bit (affine, as mlx-lm's 4-bit conversions)
#   gemma4b Gemma 3 4B's text model, bfloat16 (262k vocabulary)
# Env: PYTHON (an interpreter with mlx for CUDA and mlx-lm; default python3),
#   BENCH_DIR (models, default /tmp/hangar-gpu-bench), ROUNDS (3),
#   STREAMS ("1 8 32 64"; empty: none), GEN (tokens per concurrent stream, 128),
#   SINGLE_GEN (tokens of the single-stream runs, 256), IDS=0 and SINGLE=0
#   skip the ids check and the single-stream runs (to split a run in parts),
#   RESULTS_FILE (keep the raw results, one JSON object a line, there too),
#   SPECULATE (native-mlx's proposers to compare single-stream, as
#   "off,oracle,lookup"; oracle is the speculative path's own answer as a
#   predicted output, fed back until it predicts itself, acceptance 1.0:
#   the verification machinery's ceiling), DRAFT_TOKENS (4),
#   LOAD_SPECULATE (stream counts, as "8 64", at which native-mlx's own
#   interleaved rounds compare every request asking for prompt lookup
#   against none: speculation under load; its table goes to stdout),
#   NATIVE_ARGS (more options of native-mlx-bench's batched runs, as
#   "--step-tokens 1024").
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${1:?usage: scripts/gpu-bench.sh BENCH_BINARY [qwen05|qwen7 ...]}"
shift
SHAPES=("$@")
[[ ${#SHAPES[@]} -gt 0 ]] || SHAPES=(qwen05)
PY="${PYTHON:-python3}"
BENCH_DIR="${BENCH_DIR:-/tmp/hangar-gpu-bench}"
ROUNDS="${ROUNDS:-3}"
read -r -a STREAMS <<<"${STREAMS-1 8 32 64}"
GEN="${GEN:-128}"
SINGLE_GEN="${SINGLE_GEN:-256}"
BENCH="$REPO/plugins/native-mlx/bench"
RESULTS="${RESULTS_FILE:-$(mktemp)}"
[[ -n "${RESULTS_FILE:-}" ]] || trap 'rm -f "$RESULTS"' EXIT

record() { # shape, kind, engine, streams, value (null when a run gave none)
  printf '{"shape":"%s","kind":"%s","engine":"%s","streams":%s,"value":%s}\n' \
    "$1" "$2" "$3" "$4" "${5:-null}" >>"$RESULTS"
}

record_run() { # shape, engine, streams, the timed run's line of a concurrent bench
  record "$1" aggregate "$2" "$3" "$(sed -n 's/.* run 1: \([0-9.]*\) tok\/s aggregate.*/\1/p' <<<"$4")"
  record "$1" ttft_p99 "$2" "$3" "$(sed -n 's/.* ttft p50 [0-9.]* ms p99 \([0-9.]*\) ms.*/\1/p' <<<"$4")"
}

for shape in "${SHAPES[@]}"; do
  base="${shape%-q4}"
  case "$base" in
    qwen05) dims=(--arch qwen2 --bench --hidden 896 --layers 24 --heads 14 --kv-heads 2 --intermediate 4864
      --vocab 151936) ;;
    qwen7) dims=(--arch qwen2 --bench --hidden 3584 --layers 28 --heads 28 --kv-heads 4 --intermediate 18944
      --vocab 152064) ;;
    # Issue 35's families at their real sizes, written 4-bit by mlx-lm's own
    # classes where the bfloat16 copy would not fit the device's disk.
    moe30) dims=(--arch qwen3_moe --bench --bits 4 --hidden 2048 --layers 48 --heads 32 --kv-heads 4
      --head-dim 128 --intermediate 6144 --moe-intermediate 768 --experts 128 --experts-per-tok 8
      --vocab 151936) ;;
    gptoss20) dims=(--arch gpt_oss --bench --bits 4 --hidden 2880 --layers 24 --heads 64 --kv-heads 8
      --head-dim 64 --intermediate 2880 --experts 32 --experts-per-tok 4 --vocab 201088 --window 128) ;;
    gemma4b) dims=(--arch gemma3_text --bench --hidden 2560 --layers 34 --heads 8 --kv-heads 4
      --head-dim 256 --intermediate 10240 --vocab 262208 --window 1024) ;;
    tiny) dims=(--arch qwen2) ;;
    *) echo "unknown shape '$shape' (qwen05, qwen7, tiny, each with -q4 or not; moe30, gptoss20, gemma4b)" >&2
      exit 2 ;;
  esac
  dtype=bfloat16
  [[ "$base" == tiny ]] && dtype=float32
  model="$BENCH_DIR/$base"
  if [[ ! -f "$model/config.json" ]]; then
    echo "gpu-bench: making $model" >&2
    # Written aside and then renamed: a folder cut short (a timeout) is
    # never taken for a whole one.
    rm -rf "$model.part"
    "$PY" "$REPO/scripts/make_tiny_model.py" "$model.part" --dtype "$dtype" "${dims[@]}" >/dev/null
    mv "$model.part" "$model"
  fi
  if [[ "$shape" != "$base" ]]; then
    quantized="$BENCH_DIR/$shape"
    if [[ ! -f "$quantized/config.json" ]]; then
      echo "gpu-bench: quantizing $model to $quantized" >&2
      rm -rf "$quantized.part"
      "$PY" -m mlx_lm convert --hf-path "$model" --mlx-path "$quantized.part" -q --q-bits 4 --q-group-size 64 >/dev/null
      mv "$quantized.part" "$quantized"
    fi
    model="$quantized"
  fi

  # Greedy ids, for a short and a long prompt: native-mlx (a session, its
  # batching engine alone and among 7 other requests) against mlx-lm's
  # generate_step, and mlx-lm's own batch_generate (alone and among 7
  # others) against its generate_step: a difference of the size of mlx-lm's
  # own between its paths is kernel order, not an engine bug.
  prompts=(12 512)
  [[ "${IDS:-1}" == 0 ]] && prompts=()
  for prompt in "${prompts[@]}"; do
    native="$("$BIN" --ids --company 8 --prompt-tokens "$prompt" --gen-tokens 64 ${NATIVE_ARGS:-} "$model")" || native='{}'
    reference="$("$PY" "$BENCH/mlx_lm_ids.py" --company 8 --prompt-tokens "$prompt" --gen-tokens 64 "$model")" || reference='{}'
    "$PY" - "$shape" "$prompt" "$native" "$reference" >>"$RESULTS" <<'PYTHON'
import json, sys
shape, prompt = sys.argv[1], int(sys.argv[2])
native, reference = json.loads(sys.argv[3]), json.loads(sys.argv[4])
def first_difference(a, b):
    if a is None or b is None:
        return "no result"
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), None if len(a) == len(b) else n)
base = reference.get("alone")
print(json.dumps({"shape": shape, "kind": "ids", "prompt": prompt, "comparisons": {
    "native-mlx session vs mlx-lm generate_step": first_difference(native.get("ids"), base),
    "native-mlx batcher alone vs its session": first_difference(native.get("batch_of_one"), native.get("ids")),
    "native-mlx batcher among 8 vs alone": first_difference(native.get("batched"), native.get("batch_of_one")),
    "mlx-lm batch_generate alone vs generate_step": first_difference(reference.get("batch_of_one"), base),
    "mlx-lm batch_generate among 8 vs alone": first_difference(reference.get("batched"), reference.get("batch_of_one")),
}}))
PYTHON
  done

  # Speculative decoding, single stream: native-mlx's own interleaved
  # rounds of each proposer in one process (its table goes to stdout).
  if [[ -n "${SPECULATE:-}" ]]; then
    echo "gpu-bench: $shape speculation ($SPECULATE, k ${DRAFT_TOKENS:-4})" >&2
    "$BIN" --speculate "$SPECULATE" --draft-tokens "${DRAFT_TOKENS:-4}" --runs "$ROUNDS" \
      --prompt-tokens 128 --gen-tokens "$SINGLE_GEN" "$model" || echo "gpu-bench: $shape speculation: no result" >&2
  fi

  read -r -a load_streams <<<"${LOAD_SPECULATE:-}"
  for n in "${load_streams[@]}"; do
    echo "gpu-bench: $shape speculation under load ($n streams, off against lookup)" >&2
    "$BIN" --concurrent "$n" --speculate off,lookup --draft-tokens "${DRAFT_TOKENS:-0}" \
      --runs "$ROUNDS" --gen-tokens "$GEN" ${NATIVE_ARGS:-} "$model" |
      sed -n '/every request speculating/,$p' || echo "gpu-bench: $shape $n streams speculating: no result" >&2
  done

  for round in $(seq "$ROUNDS"); do
    if [[ "${SINGLE:-1}" != 0 ]]; then
      echo "gpu-bench: $shape round $round: single stream" >&2
      value="$("$BIN" --json --runs 1 --prompt-tokens 128 --gen-tokens "$SINGLE_GEN" "$model" |
        "$PY" -c 'import json,sys; print(json.load(sys.stdin)["decode_tps"])')" || value=""
      record "$shape" single native-mlx 1 "$value"
      value="$("$PY" "$BENCH/mlx_lm_bench.py" --runs 1 --prompt-tokens 128 --gen-tokens "$SINGLE_GEN" "$model" |
        "$PY" -c 'import json,sys; print(json.load(sys.stdin)["decode_tps"])')" || value=""
      record "$shape" single mlx-lm 1 "$value"
    fi
    for n in "${STREAMS[@]}"; do
      echo "gpu-bench: $shape round $round: $n streams" >&2
      # The timed run's line: "... run 1: X tok/s aggregate (..., ttft p50
      # A ms p99 B ms...)".
      # The next line says where its steps' time went (to the log).
      out="$("$BIN" --concurrent "$n" --runs 1 --gen-tokens "$GEN" ${NATIVE_ARGS:-} "$model")" || out=""
      grep -A1 ' run 1: ' <<<"$out" | sed -n 's/^ *steps:/gpu-bench: native-mlx steps:/p' >&2 || true
      line="$(grep ' run 1: ' <<<"$out")" || line=""
      record_run "$shape" native-mlx "$n" "$line"
      line="$("$PY" "$BENCH/mlx_lm_batch_bench.py" --concurrent "$n" --runs 1 --gen-tokens "$GEN" "$model" |
        grep ' run 1: ')" || line=""
      record_run "$shape" mlx-lm "$n" "$line"
    done
  done
done

"$PY" - "$RESULTS" "$ROUNDS" <<'PYTHON'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print(f"medians [min-max] over {sys.argv[2]} interleaved rounds, tokens/s unless marked\n")
print("| model, prompt | 64 greedy ids | first difference |")
print("|---|---|---|")
for r in (r for r in rows if r["kind"] == "ids"):
    for what, first in r["comparisons"].items():
        verdict = "same" if first is None else (first if isinstance(first, str) else f"token {first}")
        print(f"| {r['shape']}, {r['prompt']} tokens | {what} | {verdict} |")
print()
print("| model | what | streams | native-mlx | mlx-lm | ratio of medians | ratio per round |")
print("|---|---|---:|---:|---:|---:|---|")
groups = {}
for r in (r for r in rows if r["kind"] != "ids" and r["value"] is not None):
    groups.setdefault((r["shape"], r["kind"], r["streams"]), {}).setdefault(r["engine"], []).append(r["value"])
def per_round(n, m):
    # Each engine's values are in round order; a round that gave no result
    # for one engine leaves the pairs unknown.
    if len(n) != len(m):
        return "rounds differ"
    return ", ".join(f"{a / b:.2f}" for a, b in zip(n, m))
def cell(values):
    return f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]"
for (shape, kind, streams), engines in groups.items():
    n, m = engines.get("native-mlx"), engines.get("mlx-lm")
    if not n or not m:
        print(f"| {shape} | {kind} | {streams} | {cell(n) if n else 'no result'} | {cell(m) if m else 'no result'} | | |")
        continue
    what = {"single": "decode, one stream", "aggregate": "aggregate decode",
            "ttft_p99": "p99 time to first token, ms (lower is better)"}[kind]
    print(f"| {shape} | {what} | {streams} | {cell(n)} | {cell(m)} | "
          f"{statistics.median(n) / statistics.median(m):.2f}x | {per_round(n, m)} |")
PYTHON
