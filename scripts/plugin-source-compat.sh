#!/usr/bin/env bash
# Plugin sources survive a plugin-api 1.x addition: builds, against a copy
# of plugin-api with a new field in every #[non_exhaustive] message (what a
# minor release adds), the SDK's examples, a crate made from the SDK's
# native template, the repo's plugins in this workspace, and a fixture
# plugin written against 1.2's surface (tests/plugin-source-compat/fixture).
# A struct literal or an exhaustive pattern of a message anywhere in them
# fails this check, as it would fail a third party's build.
# Usage: scripts/plugin-source-compat.sh  (CI runs it; about 2-4 min cold).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo="$PWD"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# Its own target dir, kept between runs: the copy differs from the repo's crates.
export CARGO_TARGET_DIR="$repo/target/plugin-source-compat"

cp -r plugin-api sdk Cargo.lock "$work/"
mkdir -p "$work/plugins"
cp -r plugins/mlx-lm plugins/mlxcel "$work/plugins/"
cp -r tests/plugin-source-compat/fixture "$work/fixture"
# Dev-dependencies (the test kit, the host) are resolved, never built here.
ln -s "$repo/host" "$work/host"
rm -rf "$work/sdk/target" "$work/plugins/"*/target
sed -e 's|^members = .*|members = ["plugin-api", "sdk", "plugins/mlx-lm", "plugins/mlxcel", "fixture"]|' \
  Cargo.toml >"$work/Cargo.toml"
sed -i 's|hangar-sdk = { path = "../sdk" }|hangar-sdk.workspace = true|' "$work/fixture/Cargo.toml"

changed=$(python3 tests/plugin-source-compat/add_dummy_fields.py "$work/plugin-api/src/wire.rs")
echo "plugin-source-compat: a field added to: $changed" >&2

# The native template, rendered as `hangar plugin new` renders it.
tpl="$work/template"
cp -r sdk/templates/native "$tpl"
sed -e 's/{{crate}}/compat-template/; s/{{lib}}/compat_template/' \
  -e "s|{{sdk}}|hangar-sdk = { path = \"$work/sdk\" }|; s/{{testkit}}//" \
  sdk/templates/native/Cargo.toml.tmpl >"$tpl/Cargo.toml"
rm "$tpl/Cargo.toml.tmpl"
find "$tpl" -type f -exec sed -i 's/{{id}}/compat/g' {} +
cp Cargo.lock "$tpl/Cargo.lock"

(cd "$work" && cargo check --quiet -p hangar-sdk --examples \
  && cargo check --quiet -p hangar-plugin-mlx-lm -p hangar-plugin-mlxcel --lib \
  && cargo check --quiet -p plugin-source-compat-fixture --lib)
(cd "$tpl" && cargo check --quiet --lib)
echo "plugin-source-compat: 4 passed, 0 failed"
