#!/usr/bin/env bash
# Installs the Debian packages a job needs, once, in groups:
#   build  libclang-dev (bindgen, for native-mlx's mlx-sys): what building
#          and serving needs;
#   tests  chromium and chromium-driver (the /admin page's browser test,
#          through selenium): only the test suite installs them.
# Usage: scripts/system-deps.sh [GROUP...]   (no group: build)
# Idempotent; uses sudo when not root.
set -euo pipefail
groups=("$@")
[[ ${#groups[@]} -gt 0 ]] || groups=(build)
missing=()
for group in "${groups[@]}"; do
  case "$group" in
    build) packages=(libclang-dev) ;;
    tests) packages=(chromium chromium-driver) ;;
    *) echo "system-deps: unknown group '$group' (groups: build, tests)" >&2; exit 2 ;;
  esac
  for pkg in "${packages[@]}"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
sudo=""; [[ "$(id -u)" == 0 ]] || sudo="sudo"
echo "system-deps: installing ${missing[*]}" >&2
$sudo apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >&2
