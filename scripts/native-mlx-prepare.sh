#!/usr/bin/env bash
# Prepares the patched mlx-sys 0.7.0 that plugins/native-mlx builds against.
# Takes the crate from crates.io through cargo (checksum-verified .crate in the
# cargo cache), unpacks it into plugins/native-mlx/.patched/mlx-sys (ignored by
# git) and applies patches/mlx-sys-0.7.0-linux.patch. Idempotent: it does
# nothing when the folder already holds this exact patch.
# Needs: cargo, tar, patch. Building then needs libclang-dev (bindgen), a C++20
# compiler and MLX 0.32.4 (scripts/python-env.sh installs it into .venv).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CRATE=mlx-sys
VERSION=0.7.0
PATCH="$REPO/patches/$CRATE-$VERSION-linux.patch"
DEST="$REPO/plugins/native-mlx/.patched/$CRATE"
STAMP="$DEST/.hangar-patch"
WANT="$CRATE $VERSION $(sha256sum "$PATCH" | cut -d' ' -f1)"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  echo "native-mlx-prepare: $DEST is up to date" >&2
  exit 0
fi

# A throwaway manifest lets cargo download and verify the exact crate; the
# plugin's own manifest cannot be used, since its [patch] points at $DEST.
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
mkdir "$TMP/src"
: > "$TMP/src/lib.rs"
cat > "$TMP/Cargo.toml" <<TOML
[package]
name = "fetch-$CRATE"
version = "0.0.0"
edition = "2021"
[dependencies]
$CRATE = "=$VERSION"
TOML
cargo fetch --quiet --manifest-path "$TMP/Cargo.toml"

CARGO_DIR="${CARGO_HOME:-$HOME/.cargo}"
ARCHIVE="$(ls "$CARGO_DIR"/registry/cache/*/"$CRATE-$VERSION.crate" | head -n1)"
echo "native-mlx-prepare: unpacking $ARCHIVE and applying $(basename "$PATCH")" >&2
rm -rf "$DEST.tmp"
mkdir -p "$DEST.tmp"
tar -xzf "$ARCHIVE" -C "$DEST.tmp" --strip-components=1
patch --quiet -p1 -d "$DEST.tmp" < "$PATCH"
echo "$WANT" > "$DEST.tmp/.hangar-patch"
rm -rf "$DEST"
mv "$DEST.tmp" "$DEST"
echo "native-mlx-prepare: ready at $DEST" >&2
