#!/usr/bin/env bash
# The main job on a fresh machine: set up the Python engine venv, build
# Hangar and its plugins, generate a tiny random-weight model, and show which
# engine Hangar resolves for it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY="$(scripts/python-env.sh)"
cargo build --workspace --quiet
mkdir -p models
[ -f models/tiny-llama/model.safetensors ] || "$PY" scripts/make_tiny_model.py models/tiny-llama >/dev/null
target/debug/hangar platform
target/debug/hangar resolve models/tiny-llama || true
