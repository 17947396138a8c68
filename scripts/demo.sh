#!/usr/bin/env bash
# The main job on a fresh machine: set up the Python engine venv (mlx-lm),
# build Hangar and its plugins, generate a tiny random-weight model, and run
# `hangar serve` on it with whichever engine resolves. Ctrl-C stops it (and
# every engine it started). Extra arguments go to `hangar serve`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/system-deps.sh
PY="$(scripts/python-env.sh)"
cargo build --quiet -p hangar
PLUGINS="$(scripts/build-plugins.sh)"
mkdir -p models target/demo
[ -f models/tiny-llama/model.safetensors ] || "$PY" scripts/make_tiny_model.py models/tiny-llama >/dev/null
# The same kind of model as one GGUF file, for the llama-server plugin.
[ -f models/tiny-gguf.gguf ] || "$PY" scripts/make_tiny_gguf.py models/tiny-gguf.gguf
cat > target/demo/config.toml <<TOML
# Written by scripts/demo.sh: point the mlx-lm and llama-server plugins at
# the project's venv, and let mlx-lm run the Python interpreter it names.
[plugins.mlx-lm]
program = "$PY"
allow_programs = ["python3"]

[plugins.llama-server]
program = "$(dirname "$PY")/llama-server"
TOML

hangar() { target/debug/hangar --plugins-dir "$PLUGINS" --config target/demo/config.toml "$@"; }
hangar plugins
hangar resolve models/tiny-llama
hangar resolve models/tiny-gguf.gguf
PORT="${PORT:-8080}"
cat >&2 <<MSG

Try, from another terminal:
  curl -s localhost:$PORT/v1/models
  curl -s localhost:$PORT/v1/chat/completions -H 'content-type: application/json' \\
    -d '{"model": "tiny-llama", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16}'
  (or "model": "tiny-gguf", served by llama.cpp through the WebAssembly plugin)
(The models have random weights: expect well-formed answers full of nonsense.)

MSG
exec target/debug/hangar --plugins-dir "$PLUGINS" --config target/demo/config.toml \
  serve --model-dir models --port "$PORT" --state-dir target/demo/state "$@"
