#!/usr/bin/env bash
# Installs the system packages the build needs, once: libclang-dev (bindgen,
# for native-mlx's mlx-sys); chromium and chromium-driver (the /admin page's
# browser test, through selenium). Idempotent; uses sudo when not root.
set -euo pipefail
missing=()
for pkg in libclang-dev chromium chromium-driver; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
sudo=""; [[ "$(id -u)" == 0 ]] || sudo="sudo"
echo "system-deps: installing ${missing[*]}" >&2
$sudo apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >&2
