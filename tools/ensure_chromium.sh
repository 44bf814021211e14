#!/usr/bin/env bash
# The browser test opens the nightly report in Debian's Chromium; install it
# when missing (CI machines start without it). Needs root and Debian's mirrors.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
echo "installing Debian's chromium for the browser test" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium >/dev/null
