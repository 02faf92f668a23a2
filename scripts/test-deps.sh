#!/usr/bin/env bash
# Installs what `make test` needs when it is missing: Debian's python3-torch
# (the end-to-end tests train a real model under /usr/bin/python3), shellcheck
# and systemd-analyze (the deploy/ checks), curl and bash (user-data test),
# promtool (Debian package prometheus: the alert rules in deploy/prometheus).
set -euo pipefail

missing=()
/usr/bin/python3 -c 'import torch' >/dev/null 2>&1 || missing+=(python3-torch)
command -v shellcheck >/dev/null 2>&1 || missing+=(shellcheck)
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus) # promtool: deploy/prometheus rules
command -v mypy >/dev/null 2>&1 || missing+=(mypy) # make test-python: mypy --strict over the client
[ -x /usr/bin/python3 ] || missing+=(python3)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "installing test dependencies: ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
