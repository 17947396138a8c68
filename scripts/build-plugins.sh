#!/usr/bin/env bash
# Builds the repo's engine plugins (plugins/*) and lays them out as a
# plugins dir that `hangar --plugins-dir` reads: target/plugins/<id>/ with
# plugin.toml and the built library. Prints that folder's path last.
#
# Plugins in the root workspace build in debug with the host. WebAssembly
# plugins (kind = "wasm", workspaces of their own, as third parties write
# them) build in release for wasm32-unknown-unknown. native-mlx is a
# workspace of its own (it needs MLX; the host must not): it builds in
# release, after scripts/native-mlx-prepare.sh, unless HANGAR_NO_NATIVE_MLX=1.
# HANGAR_NO_WASM=1 leaves the WebAssembly plugins out (their build needs the
# wasm32 target; scripts/demo.sh adds them later, with the engine they run).
# With --release the root workspace's plugins build in release too, into
# target/release-plugins (what scripts/demo.sh serves with).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

profile=debug out="target/plugins" cargo_profile=()
if [[ "${1:-}" == --release ]]; then
  profile=release out="target/release-plugins" cargo_profile=(--release)
fi
packages=()
for manifest in plugins/*/plugin.toml; do
  dir="$(dirname "$manifest")"
  grep -q '^\[workspace\]' "$dir/Cargo.toml" && continue
  packages+=(-p "$(sed -n 's/^name = "\(.*\)"/\1/p' "$dir/Cargo.toml" | head -1)")
done
cargo build --quiet "${cargo_profile[@]}" "${packages[@]}" >&2

case "$(uname -s)" in
  Darwin) lib_suffix=.dylib ;;
  *) lib_suffix=.so ;;
esac
for manifest in plugins/*/plugin.toml; do
  dir="$(dirname "$manifest")"
  built="target/$profile" prefix=lib suffix="$lib_suffix"
  if grep -q '^kind = "wasm"' "$manifest"; then
    [[ "${HANGAR_NO_WASM:-}" == 1 ]] && continue
    rustup target add wasm32-unknown-unknown >/dev/null 2>&1 || true
    (cd "$dir" && cargo build --quiet --release --lib --target wasm32-unknown-unknown) >&2
    built="$dir/target/wasm32-unknown-unknown/release" prefix="" suffix=.wasm
  elif grep -q '^\[workspace\]' "$dir/Cargo.toml"; then
    [[ "${HANGAR_NO_NATIVE_MLX:-}" == 1 ]] && continue
    scripts/native-mlx-prepare.sh >&2
    (cd "$dir" && cargo build --quiet --release --lib) >&2
    built="$dir/target/release"
  fi
  id=$(sed -n 's/^id = "\(.*\)"/\1/p' "$manifest" | head -1)
  artifact=$(sed -n 's/^artifact = "\(.*\)"/\1/p' "$manifest" | head -1)
  [[ "$artifact" == *.* ]] || artifact="$prefix$artifact$suffix"
  mkdir -p "$out/$id"
  # Copy then rename: a running host maps the old library, and overwriting
  # a mapped file in place would crash it.
  cp "$manifest" "$out/$id/.plugin.toml.new" && mv "$out/$id/.plugin.toml.new" "$out/$id/plugin.toml"
  cp "$built/$artifact" "$out/$id/.$artifact.new" && mv "$out/$id/.$artifact.new" "$out/$id/$artifact"
done
echo "$PWD/$out"
