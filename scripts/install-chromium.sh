#!/usr/bin/env bash
# The console's browser tests (tests/cli/test_console.py) drive Debian's Chromium through
# chromedriver. Install both when missing (as root, on Debian); elsewhere report what to install.
set -euo pipefail

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "The console tests need Chromium and its driver: apt-get install chromium chromium-driver (as root)." >&2
  exit 3
fi
echo "Installing Debian's chromium and chromium-driver ..." >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
