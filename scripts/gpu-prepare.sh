#!/usr/bin/env bash
# Prepares a GPU run of scripts/gpu-bench.sh on a machine that has a CUDA GPU
# but no Rust and no package index (the lent device machines): builds
# native-mlx-bench here against MLX's CUDA wheel and lays out what travels,
# in two folders of at most 64 MiB each (the wheel alone is about 87 MB):
#   .dev/a: the first part of the mlx-cuda-13 wheel and the bench binary;
#   .dev/b: the rest of that wheel, the mlx (cp312) and mlx-lm wheels, and
#           the engine's test binary (tests/engine, the parity suite);
#   .dev/c, with SERVE=1: what scripts/serving-bench.sh needs there (see
#           below), carried in a third call.
# With .dev/ptx.tar.xz (MLX's compiled CUDA kernels of an earlier device run,
# `scripts/gpu-device.sh keep-ptx`), .dev/a carries it too, and `stage`
# puts it where MLX looks, so a fresh machine skips those compilations (the
# engine tests' fixtures spent 427-460 s compiling on a bare H200).
# On the device, carry .dev/a in one call and .dev/b in the next (within the
# time the machine stays warm), each running scripts/gpu-device.sh.
# Idempotent: downloads and the build are reused.
#
# The binary links the CUDA wheel's libmlx.so, whose CUDA libraries are not
# here: the link allows them to be missing (--allow-shlib-undefined), and
# on the device LD_LIBRARY_PATH finds them (scripts/gpu-device.sh).
# The binaries travel xz-compressed (a quarter of their size), so that
# .dev/b and .dev/c fit one call together: call 2 then installs MLX and the
# serving bench's files at once.
# With ONE=1 (builds what SERVE=1 builds), also .dev/one: all of it in one
# folder of about 48 MB (65 with SERVE=1's c/, past a call's 64 MiB: move
# c/ out, or the references' packages), for one call (`scripts/gpu-device.sh one`), with MLX's CUDA
# library cut to the sm_90 cubins of an H100 or H200 and stripped
# (scripts/gpu-slim-mlx.py) and installed MLX, mlx-lm and the binaries in
# one tar.xz: a call that installs, then runs, is not cut off between a
# staging call and an install call (twice the machine was taken back there).
# Env: PART_BYTES (55M), CARGO_TARGET_DIR (default
# plugins/native-mlx/target/cuda), SERVE=1 (also .dev/c), ONE=1, SM (90),
# EXTRA_BINS (with ONE=1: "PATH=NAME ..." more binaries in gpu/, e.g.
# a base build as native-mlx-bench-base for gpu-session.sh ab).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
MLX=0.32.4
MLX_LM=0.32.2
WHL=.dev/whl
PREFIX=.dev/prefix-$MLX
mkdir -p "$WHL" .dev/a .dev/b

if ! ls "$WHL"/mlx_cuda_13-"$MLX"-*.whl >/dev/null 2>&1; then
  echo "gpu-prepare: downloading mlx-cuda-13 and mlx $MLX, mlx-lm $MLX_LM" >&2
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_35_x86_64 --platform manylinux_2_17_x86_64 \
    -d "$WHL" "mlx==$MLX" "mlx-cuda-13==$MLX" "mlx-lm==$MLX_LM" >&2
fi
# mlx-vlm (pure Python) for the vision tests' reference; what it imports
# besides MLX (transformers, Pillow, numpy) the device's image has.
MLX_VLM=0.7.6
if ! ls "$WHL"/mlx_vlm-"$MLX_VLM"-*.whl >/dev/null 2>&1; then
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$WHL" "mlx-vlm==$MLX_VLM" >&2
fi
# Pillow at the version the tests' reference pins here: the vision tests
# compare pixels exactly, and the image's own Pillow resizes otherwise
# (stop 55: a pixel level apart where Pillow 13 resizes vertically first).
PILLOW="$(sed -n 's/^pillow==//p' scripts/python-constraints.txt)"
if ! ls "$WHL"/pillow-"$PILLOW"-cp312-*.whl >/dev/null 2>&1; then
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 -d "$WHL" "pillow==$PILLOW" >&2
fi
# The references' transformers (mlx-vlm's image processor, mlx-lm's
# tokenizers) and what it needs, at the versions pinned here, numpy
# excepted (the image's serves): the image's own transformers processed
# images with alpha otherwise (stop 55: gray-alpha and RGBA pixels apart).
REF="$WHL/reference"
if [[ ! -f "$REF/.done" ]]; then
  rm -rf "$REF" && mkdir -p "$REF"
  python3 -m pip download --quiet --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -c scripts/python-constraints.txt -d "$REF" "transformers==$(sed -n 's/^transformers==//p' scripts/python-constraints.txt)" >&2
  rm -f "$REF"/numpy-*.whl
  touch "$REF/.done"
fi
cuda="$(ls "$WHL"/mlx_cuda_13-"$MLX"-*.whl)"
python="$(ls "$WHL"/mlx-"$MLX"-*.whl)"
if [[ ! -f "$PREFIX/mlx/lib/libmlx.so" ]]; then
  mkdir -p "$PREFIX"
  (cd "$PREFIX" && unzip -q -o "$REPO/$cuda" && unzip -q -o "$REPO/$python")
fi

# bindgen (mlx-sys) needs libclang.
scripts/system-deps.sh build
scripts/native-mlx-prepare.sh
target="${CARGO_TARGET_DIR:-$REPO/plugins/native-mlx/target/cuda}"
echo "gpu-prepare: building native-mlx-bench against $PREFIX/mlx (MLX for CUDA)" >&2
(cd plugins/native-mlx && MLX_PREFIX="$REPO/$PREFIX/mlx" CARGO_TARGET_DIR="$target" \
  RUSTFLAGS="-C link-arg=-Wl,--allow-shlib-undefined" \
  cargo build --quiet --release --bin native-mlx-bench)
echo "gpu-prepare: building the engine's test binary (the parity suite) likewise" >&2
tests="$(cd plugins/native-mlx && MLX_PREFIX="$REPO/$PREFIX/mlx" CARGO_TARGET_DIR="$target" \
  RUSTFLAGS="-C link-arg=-Wl,--allow-shlib-undefined" \
  cargo test --quiet --release --no-run --test engine --message-format=json |
  python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "engine" and m.get("executable"):
        print(m["executable"])')"

# .dev/one carries the serving bench's files (c/, 17 MB) only where SERVE=1
# asks for them: with the references' Python packages the rest is some 48
# MB, and a call carries 64 MiB at most, the working tree included.
ONE_SERVE="${SERVE:-0}"
[[ "${ONE:-0}" == 1 ]] && SERVE=1
if [[ "${SERVE:-0}" == 1 ]]; then
  # For scripts/serving-bench.sh on the device (`hangar serve`, both
  # engines, the openai client): the host (release, stripped, xz), the plugins folder
  # with native-mlx linked against MLX for CUDA, and wheels of the openai
  # client's needs that the image lacks (at the venv's versions), in .dev/c.
  echo "gpu-prepare: the host, its plugins and the openai client's wheels for serving-bench.sh" >&2
  # The openai client's versions: the tests group (no llama.cpp build).
  PY="$(scripts/python-env.sh engines tests)"
  plugins="$(HANGAR_NO_NATIVE_MLX=1 HANGAR_NO_WASM=1 scripts/build-plugins.sh --release | tail -1)"
  # A release host, as operators run it (scripts/demo.sh): a debug build's
  # request path (the worker's and the host's JSON and SSE per token) is
  # several times slower, and at 32-64 streams it is measured, not the engine.
  # And one with mimalloc as malloc (feature `mimalloc`), to compare.
  cargo build --quiet --release -p hangar --features mimalloc
  cp target/release/hangar .dev/hangar-mimalloc
  cargo build --quiet --release -p hangar
  (cd plugins/native-mlx && MLX_PREFIX="$REPO/$PREFIX/mlx" CARGO_TARGET_DIR="$target" \
    RUSTFLAGS="-C link-arg=-Wl,--allow-shlib-undefined" cargo build --quiet --release --lib)
  rm -rf .dev/c
  mkdir -p .dev/c/plugins/native-mlx .dev/c/whl
  for dir in "$plugins"/*/; do
    [[ "$(basename "$dir")" == native-mlx ]] || cp -r "$dir" .dev/c/plugins/
  done
  cp plugins/native-mlx/plugin.toml "$target/release/libhangar_native_mlx.so" .dev/c/plugins/native-mlx/
  find .dev/c/plugins -name '*.so' -exec strip --strip-debug {} +
  xz -T0 -f .dev/c/plugins/native-mlx/libhangar_native_mlx.so
  strip -o .dev/c/hangar target/release/hangar
  xz -T0 -f .dev/c/hangar
  strip -o .dev/c/hangar-mimalloc .dev/hangar-mimalloc
  xz -T0 -f .dev/c/hangar-mimalloc
  wheels=()
  for name in openai httpx2 httpcore2 truststore jiter pydantic pydantic-core annotated-types \
    typing-inspection sniffio; do
    wheels+=("$name==$("$PY" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$name")")
  done
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .dev/c/whl "${wheels[@]}" >&2
fi

rm -f .dev/a/* .dev/b/*
split -b "${PART_BYTES:-55M}" "$cuda" .dev/a/cuda.part.
for part in .dev/a/cuda.part.*; do
  [[ "$part" == .dev/a/cuda.part.aa ]] || mv "$part" .dev/b/
done
xz -T0 -c "$target/release/native-mlx-bench" >.dev/a/native-mlx-bench.xz
[[ -f .dev/ptx.tar.xz ]] && cp .dev/ptx.tar.xz .dev/a/
cp "$WHL"/mlx-"$MLX"-*.whl "$WHL"/mlx_lm-"$MLX_LM"-*.whl "$WHL"/pillow-"$PILLOW"-cp312-*.whl .dev/b/
xz -T0 -c "$tests" >.dev/b/native-mlx-engine-tests.xz
du -sh .dev/a .dev/b >&2

if [[ "${ONE:-0}" == 1 ]]; then
  # .dev/one/gpu.tar.xz unpacks to gpu/: site/ (MLX for CUDA, slim,
  # mlx-lm, mlx-vlm, Pillow and transformers, as pip installs them), the two binaries and, beside it, .dev/c.
  stage=.dev/one-stage
  rm -rf "$stage" .dev/one
  mkdir -p "$stage/gpu/site" .dev/one
  cp -al "$PREFIX"/. "$stage/gpu/site/"
  rm "$stage/gpu/site/mlx/lib/libmlx.so"
  scripts/gpu-slim-mlx.py "$PREFIX/mlx/lib/libmlx.so" "$stage/gpu/site/mlx/lib/libmlx.so" ${SM:-90}
  (cd "$stage/gpu/site" && unzip -q -o "$REPO"/"$WHL"/mlx_lm-"$MLX_LM"-*.whl &&
    unzip -q -o "$REPO"/"$WHL"/mlx_vlm-"$MLX_VLM"-*.whl &&
    unzip -q -o "$REPO"/"$WHL"/pillow-"$PILLOW"-cp312-*.whl &&
    for wheel in "$REPO/$REF"/*.whl; do unzip -q -o "$wheel"; done)
  cp "$target/release/native-mlx-bench" "$tests" "$stage/gpu/"
  mv "$stage/gpu/$(basename "$tests")" "$stage/gpu/native-mlx-engine-tests"
  # More binaries (an earlier build to compare with, as
  # native-mlx-bench-base), compressed with the rest: a build of the same
  # crate adds a few MB, not its own 10.
  for extra in ${EXTRA_BINS:-}; do cp "${extra%%=*}" "$stage/gpu/${extra#*=}"; done
  tar -C "$stage" -cf - gpu | xz -T0 -9 >.dev/one/gpu.tar.xz
  rm -rf "$stage"
  if [[ "$ONE_SERVE" == 1 ]]; then cp -r .dev/c .dev/one/c; fi
  if [[ -f .dev/ptx.tar.xz ]]; then cp .dev/ptx.tar.xz .dev/one/; fi
  du -sh .dev/one >&2
fi
cat >&2 <<'TEXT'
gpu-prepare: ready. On the device:
  call 1 (carry .dev/a): scripts/gpu-device.sh stage
  (the last call, to keep the kernels compiled: scripts/gpu-device.sh keep-ptx,
   then copy the ptx.tar.xz that comes back to .dev/ptx.tar.xz here)
  call 2 (carry .dev/b): scripts/gpu-device.sh install && . /tmp/gpu-env.sh && scripts/gpu-bench.sh /tmp/gpu/native-mlx-bench qwen05
  or, with ONE=1, in one call (carry .dev/one): scripts/gpu-device.sh one && . /tmp/gpu-env.sh && ...
  later calls, while warm:  . /tmp/gpu-env.sh && ...
  the engine's tests there:  scripts/gpu-device.sh tests [FILTER]
  with SERVE=1, call 2 may carry .dev/c beside .dev/b (both fit):
    scripts/gpu-device.sh install && scripts/gpu-device.sh serve && . /tmp/gpu-env.sh &&
    scripts/serving-bench.sh qwen05 --streams 1,8,32,64
TEXT
