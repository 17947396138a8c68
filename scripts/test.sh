#!/usr/bin/env bash
# Runs Hangar's whole test suite on a fresh machine: sets up what the tests
# need (the Python venv with mlx-lm and the openai client), then runs every
# Rust test. Idempotent: a second run reuses the venv and the build.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The end-to-end tests drive a real mlx_lm.server and the official openai
# client from this venv.
HANGAR_PYTHON="$(scripts/python-env.sh)"
export HANGAR_PYTHON

cargo build --workspace --all-targets
cargo test --workspace
# End to end: hangar serve + real mlx_lm.server, driven by the openai client.
"$HANGAR_PYTHON" -m pytest tests/stand-ins tests/e2e -q
