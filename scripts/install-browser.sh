#!/bin/sh
# Debian's chromium for the browser test (tests/shell/test_ui_browser.py). Playwright cannot download
# its own browser on these machines, so the test drives /usr/bin/chromium instead.
set -eu
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-browser: not root; run: sudo apt-get install -y chromium" >&2
  exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
