#!/usr/bin/env bash
# plugin-api and the SDK grow within 1.x without breaking a plugin's build:
# cargo-semver-checks compares them with their baseline and fails on a
# breaking change (a removed item, a new field in a struct that is not
# #[non_exhaustive], a changed signature ...). There is no published
# version on crates.io, so the baseline is a git revision: the newest tag
# `plugin-api-v*` when there is one, else the revision in
# .ci/semver-baseline (the commit that made every message #[non_exhaustive],
# plugin-api 1.2.0). Installs cargo-semver-checks from crates.io when it is
# missing: a source build. Its release profile asks for fat LTO and one
# codegen unit (about 20 min on 2 cores); the install overrides both (cargo
# config outranks a manifest's profile), since CI builds it once to run it
# once.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v cargo-semver-checks >/dev/null 2>&1; then
  echo "semver-check: installing cargo-semver-checks (cargo install --locked)" >&2
  CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
    cargo install --locked cargo-semver-checks >&2
fi
baseline="$(git tag --list 'plugin-api-v*' --sort=-v:refname | head -1)"
if [[ -z "$baseline" ]]; then
  baseline="$(grep -v '^#' .ci/semver-baseline | head -1 | tr -d '[:space:]')"
fi
echo "semver-check: hangar-plugin-api and hangar-sdk against $baseline" >&2
# Its own target dir: the baseline's rustdoc must not evict the test build.
CARGO_TARGET_DIR="$PWD/target/semver-checks" \
  cargo semver-checks -p hangar-plugin-api -p hangar-sdk --baseline-rev "$baseline"
