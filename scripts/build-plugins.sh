#!/usr/bin/env bash
# Builds the repo's engine plugins (plugins/*) and lays them out as a
# plugins dir that `hangar --plugins-dir` reads: target/plugins/<id>/ with
# plugin.toml and the built library. Prints that folder's path last.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

out="target/plugins"
packages=()
for manifest in plugins/*/plugin.toml; do
  packages+=(-p "$(sed -n 's/^name = "\(.*\)"/\1/p' "$(dirname "$manifest")/Cargo.toml" | head -1)")
done
cargo build --quiet "${packages[@]}" >&2

case "$(uname -s)" in
  Darwin) prefix=lib suffix=.dylib ;;
  *) prefix=lib suffix=.so ;;
esac
for manifest in plugins/*/plugin.toml; do
  id=$(sed -n 's/^id = "\(.*\)"/\1/p' "$manifest" | head -1)
  artifact=$(sed -n 's/^artifact = "\(.*\)"/\1/p' "$manifest" | head -1)
  [[ "$artifact" == *.* ]] || artifact="$prefix$artifact$suffix"
  mkdir -p "$out/$id"
  # Copy then rename: a running host maps the old library, and overwriting
  # a mapped file in place would crash it.
  cp "$manifest" "$out/$id/.plugin.toml.new" && mv "$out/$id/.plugin.toml.new" "$out/$id/plugin.toml"
  cp "target/debug/$artifact" "$out/$id/.$artifact.new" && mv "$out/$id/.$artifact.new" "$out/$id/$artifact"
done
echo "$PWD/$out"
