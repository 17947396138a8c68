#!/usr/bin/env bash
# The open GPU measurements of issues 33, 34 and 37, in parts that each fit
# one device call (600 s), after scripts/gpu-device.sh stage / install (and
# serve, for `serve`). Each part writes its whole log to $OUT/PART.log (or
# /tmp/gpu-session when OUT is unset) and prints its last lines; nothing is
# piped into a reader that would wait for a server's children, and every
# command has its own timeout, so a hung part still returns its log.
#
# Usage: scripts/gpu-session.sh PART...
#   models     makes the folders the other parts use (qwen05, qwen7,
#              qwen7-q4), so that no timed part waits for them
#   kernels    native-mlx-bench --qmv-check with 1, 2, 4 and 8 output rows
#              per warp (NATIVE_MLX_QMV_ROWS)
#   q4         7B 4-bit (made from the 7B bf16 folder if missing): single
#              stream, MLX's qmv against Hangar's (--qmv), interleaved rounds
#   speculate  0.5B and 7B: --speculate off,oracle,forced (k 4), with the
#              per-pass breakdown
#   serve      serving-bench.sh qwen7 --streams 32,64 --rounds 3, with the
#              engine's steps per round (needs `gpu-device.sh serve`)
#   alloc      as serve, native-mlx under the hangar binary against
#              native-mlx under HANGAR_B (default /tmp/gpu/hangar-mimalloc:
#              mimalloc as malloc)
#   inhost     as serve, native-mlx in its `hangar worker` (the default)
#              against native-mlx inside the host (isolation = "none"):
#              what the worker's hop costs
#   engine     native-mlx-bench --concurrent 32 and 64 at 7B, the
#              engine-level figures `serve` is compared with, on prompts of
#              57-88 tokens as the serving bench's (--prompt-tokens 88
#              --prompt-spread 32), arriving over each of ARRIVALS_MS
#              (default "0": at once; "0 80" also spreads them as the
#              serving bench's clients do); `serve engine` fits one call
#   graphs     single stream with MLX's CUDA graph settings swept (its
#              defaults; MLX_MAX_OPS_PER_BUFFER / MLX_MAX_MB_PER_BUFFER
#              raised; MLX_USE_CUDA_GRAPHS=0), --breakdown, interleaved
#              rounds; on GRAPH_SHAPES (default "qwen05 moe30")
#   suite      the engine's GPU test suite for SUITE_S seconds (420),
#              SUITE_FILTER its filter, then keep-ptx
#   ab         single stream: BIN_A (default /tmp/gpu/native-mlx-bench-base)
#              against BIN, interleaved rounds (A B, B A, ...), with
#              --breakdown, on AB_SHAPES (qwen05 qwen7); then BIN's
#              primitives per decoding step (--graph-ops, NATIVE_MLX_GRAPH_OPS)
#   flags      one binary with FLAGS_A (default "--sums-by-rows false") against FLAGS_B
#              (default "--sums-by-rows true"), on FLAG_SHAPES (qwen05):
#              single stream with --breakdown, then FLAG_STREAMS (default
#              64) concurrent streams, interleaved rounds (A B, B A, ...);
#              then each side's primitives per decoding step
#   paged      the batching engine's decoding attention: --paged-check,
#              then 7B at 32 and 64 streams (prompts of 64-128 tokens) in
#              groups (--merge-padding 0), merged groups, and the paged
#              attention kernel, interleaved rounds
#   tiles      the sorted MoE kernel against MLX's gather_qmm
#              (--gather-check) for each NATIVE_MLX_GATHER_TILE of
#              GATHER_TILES (default "2,4 2,4,1 1,4,1 1,8,1": R,C[,S],
#              see qmv.rs's gather_tile); the
#              fastest at 64 tokens goes to $OUT/best-tile
#   gather     moe30 (made first if missing): greedy ids with and without
#              Hangar's sorted kernel (--gather-qmv true|false), then 64
#              streams with MLX's gather_qmm against it, interleaved rounds (the kernel's tile from
#              NATIVE_MLX_GATHER_TILE, as the environment sets it)
#   families   issue 35's benchmarks against mlx-lm, one shape a call
#              (FAMILY: moe30, gptoss20 or gemma4b; made first if missing):
#              ids, single stream and STREAMS (default "1 64")
# Env: BIN (the bench binary, default /tmp/gpu/native-mlx-bench), BENCH_DIR
#   (models, default /tmp/hgb; the 7B folder takes a few minutes to write,
#   so make it in a part of its own call: scripts/gpu-bench.sh makes it),
#   ROUNDS (3), SERVE_TIMEOUT (560: seconds for serve, alloc and inhost).
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Where scripts/gpu-device.sh installed MLX (its library path and Python).
# shellcheck disable=SC1091
[[ -f /tmp/gpu-env.sh ]] && . /tmp/gpu-env.sh
BIN="${BIN:-/tmp/gpu/native-mlx-bench}"
export BENCH_DIR="${BENCH_DIR:-/tmp/hgb}"
ROUNDS="${ROUNDS:-3}"
LOGS="${OUT:-/tmp/gpu-session}"
PY="${PYTHON:-python3}"
mkdir -p "$LOGS" "$BENCH_DIR"

model() { # shape: the folder, made as scripts/gpu-bench.sh makes it
  local shape="$1"
  if [[ ! -f "$BENCH_DIR/$shape/config.json" ]]; then
    STREAMS= IDS=0 SINGLE=0 ROUNDS=0 "$REPO/scripts/gpu-bench.sh" "$BIN" "$shape" >/dev/null 2>&1
  fi
  echo "$BENCH_DIR/$shape"
}

# The table of single-stream runs in log $2 (`## SHAPE round N LABEL`
# lines, then native-mlx-bench --json --breakdown lines), by shape and
# label (column title $1): decode tok/s median [min-max], step breakdown.
step_table() {
  "$PY" - "$1" "$2" <<'PYTHON'
import json, statistics, sys
title, runs, head = sys.argv[1], {}, None
for line in open(sys.argv[2]):
    if line.startswith("## ") and " round " in line:
        shape, _, _, label = line[3:].split()
        head = (shape, label)
    elif line.startswith("{") and head:
        r = json.loads(line)
        runs.setdefault(head, []).append((r["decode_tps"], r["step_us"]))
print(f"| model | {title} | decode tok/s median [min-max] | build us | submit us | wait us |")
print("|---|---|---|---:|---:|---:|")
for (shape, label), rs in runs.items():
    tps = [t for t, _ in rs]
    med = lambda k: statistics.median(s[k] for _, s in rs)
    print(f"| {shape} | {label} | {statistics.median(tps):.1f} [{min(tps):.1f}-{max(tps):.1f}] | "
          f"{med('graph_build'):.0f} | {med('submit'):.0f} | {med('eval_wait'):.0f} |")
PYTHON
}

for part in "$@"; do
  log="$LOGS/$part.log"
  : >"$log"
  case "$part" in
    models)
      for shape in qwen05 qwen7 qwen7-q4; do
        echo "## $shape: $(model "$shape")" >>"$log"
      done
      ;;
    kernels)
      for rows in 1 2 4 8; do
        echo "## NATIVE_MLX_QMV_ROWS=$rows" >>"$log"
        NATIVE_MLX_QMV_ROWS=$rows timeout 120 "$BIN" --qmv-check --runs 3 >>"$log" 2>&1
      done
      ;;
    q4)
      q4="$(model qwen7-q4)"
      for round in $(seq "$ROUNDS"); do
        for flag in "" --qmv; do
          echo "## round $round ${flag:-mlx-qmv}" >>"$log"
          timeout 150 "$BIN" --json --runs 1 --prompt-tokens 128 --gen-tokens 256 --breakdown $flag "$q4" >>"$log" 2>&1
        done
      done
      ;;
    speculate)
      for shape in qwen05 qwen7; do
        echo "## $shape" >>"$log"
        timeout 240 "$BIN" --speculate off,oracle,forced --draft-tokens 4 --runs "$ROUNDS" \
          --prompt-tokens 128 --gen-tokens 256 "$(model "$shape")" >>"$log" 2>&1
      done
      ;;
    serve)
      timeout -k 10 "${SERVE_TIMEOUT:-560}" "$REPO/scripts/serving-bench.sh" qwen7 --streams 32,64 --rounds "$ROUNDS" \
        --long-rounds 0 >>"$log" 2>&1
      ;;
    alloc)
      timeout -k 10 "${SERVE_TIMEOUT:-560}" "$REPO/scripts/serving-bench.sh" qwen7 --streams 32,64 --rounds "$ROUNDS" \
        --long-rounds 0 --against-hangar "${HANGAR_B:-/tmp/gpu/hangar-mimalloc}" >>"$log" 2>&1
      ;;
    inhost)
      timeout -k 10 "${SERVE_TIMEOUT:-560}" "$REPO/scripts/serving-bench.sh" qwen7 --streams 32,64 --rounds "$ROUNDS" \
        --long-rounds 0 --against-config '[plugins.native-mlx]\nisolation = "none"' >>"$log" 2>&1
      ;;
    engine)
      for round in $(seq "$ROUNDS"); do
        for n in 32 64; do
          # Arriving over 80 ms (the serving bench's clients sent over
          # 44-108 ms) separates what the arrivals cost the engine from
          # what the host costs.
          for spread in ${ARRIVALS_MS:-0}; do
            echo "## round $round, $n streams, arrivals over $spread ms" >>"$log"
            timeout 150 "$BIN" --concurrent "$n" --runs 1 --gen-tokens 128 --arrivals-ms "$spread" \
              --prompt-tokens 88 --prompt-spread 32 "$(model qwen7)" >>"$log" 2>&1
          done
        done
      done
      ;;
    graphs)
      # MLX's CUDA backend ends a graph (and updates and launches its
      # cached executable) every 30 ops on an H100/H200, or when the arrays
      # it binds pass 400 MB: at 7B a bfloat16 gate-up product alone binds
      # 271 MB, and an MoE layer's stacked experts more.
      presets=("default:" "ops100:MLX_MAX_OPS_PER_BUFFER=100 MLX_MAX_MB_PER_BUFFER=1000"
        "ops400:MLX_MAX_OPS_PER_BUFFER=400 MLX_MAX_MB_PER_BUFFER=100000" "nographs:MLX_USE_CUDA_GRAPHS=0")
      for shape in ${GRAPH_SHAPES:-qwen05 moe30}; do
        dir="$(model "$shape")"
        for round in $(seq "$ROUNDS"); do
          for preset in "${presets[@]}"; do
            echo "## $shape round $round ${preset%%:*}" >>"$log"
            # shellcheck disable=SC2086 # the preset's assignments, split
            env ${preset#*:} timeout 150 "$BIN" --json --runs 1 --prompt-tokens 128 --gen-tokens 256 \
              --breakdown "$dir" >>"$log" 2>&1
          done
        done
      done
      step_table "MLX graph settings" "$log" >>"$log"
      ;;
    suite)
      # The engine's GPU suite (scripts/gpu-device.sh tests, one test at a
      # time, SUITE_FILTER as its filter) for at most SUITE_S seconds
      # (default 420: a whole run takes about 560 s warm, so a first call
      # runs what fits and a second SUITE_FILTER the rest), then MLX's
      # compiled kernels kept in $OUT/ptx.tar.xz; the log keeps each
      # failure's reason as it happens (--nocapture).
      timeout "${SUITE_S:-420}" "$REPO/scripts/gpu-device.sh" tests ${SUITE_FILTER:-} >>"$log" 2>&1
      echo "suite: rc=$?" >>"$log"
      [[ -n "${OUT:-}" ]] && "$REPO/scripts/gpu-device.sh" keep-ptx >>"$log" 2>&1
      grep -a "^test \|panicked\|test result\|suite: rc" "$log" >"$log.summary"
      cat "$log.summary" >>"$log"
      ;;
    ab)
      # Single stream, BIN_A (default /tmp/gpu/native-mlx-bench-base, an
      # earlier build carried beside) against BIN, interleaved rounds with
      # --breakdown, on AB_SHAPES (default qwen05
      # qwen7); then BIN's primitive count of a decoding step, alone
      # (--graph-ops) and in the batching engine at 1 and 4 rows
      # (NATIVE_MLX_GRAPH_OPS).
      a="${BIN_A:-/tmp/gpu/native-mlx-bench-base}"
      for shape in ${AB_SHAPES:-qwen05 qwen7}; do
        dir="$(model "$shape")"
        for round in $(seq "$ROUNDS"); do
          for b in "$a" "$BIN"; do
            [[ $((round % 2)) == 0 && "$b" == "$a" ]] && continue
            echo "## $shape round $round $(basename "$b")" >>"$log"
            timeout 150 "$b" --json --runs 1 --prompt-tokens 128 --gen-tokens 256 --breakdown "$dir" >>"$log" 2>&1
          done
          if [[ $((round % 2)) == 0 ]]; then
            echo "## $shape round $round $(basename "$a")" >>"$log"
            timeout 150 "$a" --json --runs 1 --prompt-tokens 128 --gen-tokens 256 --breakdown "$dir" >>"$log" 2>&1
          fi
        done
        echo "## graph-ops $shape" >>"$log"
        timeout 60 "$BIN" --graph-ops --prompt-tokens 128 "$dir" >>"$log" 2>&1
        for n in 1 4; do
          NATIVE_MLX_GRAPH_OPS=1 timeout 60 "$BIN" --concurrent "$n" --runs 1 --gen-tokens 16 \
            --prompt-tokens 128 "$dir" 2>&1 | grep "decoding step of" >>"$log"
        done
      done
      step_table binary "$log" >>"$log"
      ;;
    flags)
      fa="${FLAGS_A:---sums-by-rows false}" fb="${FLAGS_B:---sums-by-rows true}"
      for shape in ${FLAG_SHAPES:-qwen05}; do
        dir="$(model "$shape")"
        for round in $(seq "$ROUNDS"); do
          order=(a b)
          [[ $((round % 2)) == 0 ]] && order=(b a)
          for side in "${order[@]}"; do
            flags="$fa"
            [[ $side == b ]] && flags="$fb"
            echo "## $shape round $round $side" >>"$log"
            # shellcheck disable=SC2086 # the side's flags, split
            timeout 150 "$BIN" --json --runs 1 --prompt-tokens 128 --gen-tokens 256 --breakdown $flags \
              "$dir" >>"$log" 2>&1
            for n in ${FLAG_STREAMS:-64}; do
              echo "#### $shape round $round $side $n streams" >>"$log"
              # shellcheck disable=SC2086
              timeout 150 "$BIN" --concurrent "$n" --runs 1 --gen-tokens 128 --prompt-tokens 88 \
                --prompt-spread 32 $flags "$dir" >>"$log" 2>&1
            done
          done
        done
        for side in a b; do
          flags="$fa"
          [[ $side == b ]] && flags="$fb"
          echo "#### graph-ops $shape $side [$flags]" >>"$log"
          # shellcheck disable=SC2086
          timeout 60 "$BIN" --graph-ops --prompt-tokens 128 $flags "$dir" >>"$log" 2>&1
          for n in 1 4; do
            # shellcheck disable=SC2086
            NATIVE_MLX_GRAPH_OPS=1 timeout 60 "$BIN" --concurrent "$n" --runs 1 --gen-tokens 16 \
              --prompt-tokens 128 $flags "$dir" 2>&1 | grep "decoding step of" >>"$log"
          done
        done
      done
      echo "A: [$fa], B: [$fb]" >>"$log"
      step_table side "$log" >>"$log"
      "$PY" - "$log" >>"$log" <<'PYTHON'
import re, statistics, sys
runs, head = {}, None
for line in open(sys.argv[1]):
    m = re.match(r"#### (\S+) round \d+ (\S+) (\d+) streams", line)
    if m:
        head = m.groups()
    elif line.startswith("## ") or line.startswith("#### graph-ops"):
        head = None
    elif head and "warm-up" not in line:
        m = re.search(r"([\d.]+) tok/s aggregate", line)
        if m:
            runs.setdefault(head, []).append(float(m.group(1)))
print("| model | side | streams | aggregate tok/s median [min-max] |")
print("|---|---|---:|---|")
for (shape, side, n), v in sorted(runs.items()):
    print(f"| {shape} | {side} | {n} | {statistics.median(v):.1f} [{min(v):.1f}-{max(v):.1f}] |")
PYTHON
      ;;
    paged)
      timeout 120 "$BIN" --paged-check >>"$log" 2>&1
      dir="$(model qwen7)"
      for round in $(seq "$ROUNDS"); do
        for variant in "--merge-padding 0 --paged-attention false" "--paged-attention false" \
          "--paged-attention true"; do
          for n in 32 64; do
            echo "## round $round [$variant] $n streams" >>"$log"
            # shellcheck disable=SC2086 # the variant's flags, split
            timeout 90 "$BIN" --concurrent "$n" --runs 1 --gen-tokens 128 --prompt-spread 64 $variant \
              "$dir" >>"$log" 2>&1
          done
        done
      done
      ;;
    tiles)
      for tile in ${GATHER_TILES:-2,4 2,4,1 1,4,1 1,8,1}; do
        echo "## --gather-check, NATIVE_MLX_GATHER_TILE=$tile" >>"$log"
        NATIVE_MLX_GATHER_TILE=$tile timeout 150 "$BIN" --gather-check --runs 3 >>"$log" 2>&1
      done
      # Each product's time at 64 tokens (a 64-stream decoding step) per
      # tile; the tile fastest for moe30's step goes to $LOGS/best-tile.
      "$PY" - "$log" "$LOGS/best-tile" <<'PYTHON' >>"$log"
import sys
totals, tile = {}, None
for line in open(sys.argv[1]):
    if line.startswith("## "):
        tile = line.strip().rsplit("=", 1)[1]
    elif line.startswith("| ") and tile and not line.startswith("| product"):
        cells = [c.strip() for c in line.strip("|\n").split("|")]
        if len(cells) > 8 and cells[5] == "64":
            totals.setdefault(tile, {})[cells[0] + ", " + cells[4] + " bits"] = (float(cells[7]), float(cells[8]))
print("| tile | " + " | ".join(next(iter(totals.values())).keys()) + " |")
for tile, products in totals.items():
    print(f"| {tile} | " + " | ".join(f"{o:.1f} us (MLX {m:.1f})" for m, o in products.values()) + " |")
# moe30's step: gate and up (each) and down, 4-bit.
step = lambda t: sum(o * (2 if "gate" in p else 1) for p, (_, o) in totals[t].items() if p.startswith("30B") and p.endswith(" 4 bits"))
best = min(totals, key=step)
print("best tile", best)
open(sys.argv[2], "w").write(best + "\n")
PYTHON
      ;;
    gather)
      moe="$(model moe30)"
      for on in true false; do
        echo "## ids, --gather-qmv $on" >>"$log"
        timeout 120 "$BIN" --ids --company 8 --prompt-tokens 12 --gen-tokens 64 --gather-qmv "$on" "$moe" >>"$log" 2>&1
      done
      for round in $(seq "$ROUNDS"); do
        for on in false true; do
          echo "## round $round, 64 streams, --gather-qmv $on" >>"$log"
          timeout 150 "$BIN" --concurrent 64 --runs 1 --gen-tokens 128 --gather-qmv "$on" "$moe" >>"$log" 2>&1
        done
      done
      ;;
    families)
      shape="${FAMILY:-moe30}"
      model "$shape" >/dev/null
      STREAMS="${STREAMS-1 64}" timeout 540 "$REPO/scripts/gpu-bench.sh" "$BIN" "$shape" >>"$log" 2>&1
      ;;
    *)
      echo "gpu-session: unknown part '$part' (models, kernels, q4, speculate, serve, alloc, inhost, engine, graphs, ab, paged, tiles, gather, families)" >&2
      exit 2
      ;;
  esac
  echo "gpu-session: $part (exit $?), log $log" >&2
  grep -v "tokenizer you are loading" "$log" | tail -40
done
