#!/usr/bin/env bash
# Debian's Chromium for tests/test_inspect.py's headless-browser test (the credit inspector page opened as a person
# would). Installs it with apt-get when missing and allowed (root); otherwise says so and exits 0: that test then
# skips, naming the reason.
set -uo pipefail
for b in chromium chromium-browser; do command -v "$b" >/dev/null && { echo "chromium: $(command -v "$b")"; exit 0; }; done
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "chromium: not installed and cannot be (needs root and apt-get): the headless-browser test will skip"
  exit 0
fi
if apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; then
  echo "chromium: installed $(command -v chromium)"
else
  echo "chromium: apt-get install chromium failed: the headless-browser test will skip"
fi
exit 0
