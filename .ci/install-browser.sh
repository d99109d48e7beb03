#!/usr/bin/env bash
# CI: the headless browser for tests/e2e/test_dashboard_browser.py: Debian's chromium and
# the Playwright driver (the Python package only: Playwright's own browser download is never
# used; the test launches /usr/bin/chromium). Without them that test skips, saying why.
# .ci/run calls it after the install step and sets TRIOGATE_REQUIRE_BROWSER=1.
set -euo pipefail
if ! command -v chromium >/dev/null 2>&1 || ! dpkg -s fonts-dejavu-core >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  # Wait for a dpkg lock another apt run holds (unattended upgrades, a parallel install).
  apt-get -o DPkg::Lock::Timeout=300 update -q
  apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends chromium fonts-dejavu-core
fi
python3 -m pip install -q 'playwright>=1.40'
chromium --version
