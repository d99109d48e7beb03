#!/usr/bin/env bash
# CI: what tests/fleet needs to make network namespaces and cut links: iproute2 (ip, with
# `ip netns`) and iptables. Installed here, so those tests run (and fail rather than skip
# if something is missing). .ci/run calls it after the install step and sets
# TRIOGATE_REQUIRE_FLEET=1.
set -euo pipefail
if ! command -v ip >/dev/null 2>&1 || ! command -v iptables >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  # Wait for a dpkg lock another apt run holds (unattended upgrades, a parallel install).
  apt-get -o DPkg::Lock::Timeout=300 update -q
  apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends iproute2 iptables
fi
ip -V
iptables --version
