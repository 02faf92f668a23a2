#!/usr/bin/env bash
# Installs what `make test` needs when it is missing, then checks that every
# command is there (a failed install fails the run here, not an hour later).
# README.md's prerequisites name Go, /usr/bin/python3, git and root or sudo;
# every other command a test runs is listed in `tools` below, and
# scripts/testdeps_test.go fails when a test, helper or Makefile recipe runs
# a command that is neither there nor a prerequisite.
set -euo pipefail

# command            Debian package   (what runs it)
tools='
shellcheck           shellcheck       deploy/: the shell scripts
systemd-analyze      systemd          deploy/: the systemd unit
curl                 curl             deploy/: the EC2 user-data script
promtool             prometheus       deploy/prometheus: the alert rules
mypy                 mypy             make test-python: mypy --strict over the client
chromium             chromium         pkg/fleet: the fleet page in a headless browser
ip                   iproute2         integration: network namespaces for a real partition (#37)
unshare              util-linux       integration: the shipped trainer script as PID 1 of a PID namespace (#37)
'

missing=()
while read -r cmd pkg _; do
  [ -n "$cmd" ] || continue
  command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
done <<<"$tools"
# The end-to-end tests train a real model under /usr/bin/python3; the Python
# client's install test builds a venv with Debian's pip.
/usr/bin/python3 -c 'import torch' >/dev/null 2>&1 || missing+=(python3-torch)
/usr/bin/python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
[ -x /usr/bin/python3 ] || missing+=(python3)

if [ ${#missing[@]} -gt 0 ]; then
  echo "installing test dependencies: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

still=()
while read -r cmd pkg _; do
  [ -n "$cmd" ] || continue
  command -v "$cmd" >/dev/null 2>&1 || still+=("$cmd ($pkg)")
done <<<"$tools"
/usr/bin/python3 -c 'import torch, ensurepip, venv' >/dev/null 2>&1 || still+=("/usr/bin/python3 with torch and venv (python3-torch python3-venv)")
if [ ${#still[@]} -gt 0 ]; then
  echo "test-deps: still missing after the install: ${still[*]}" >&2
  exit 1
fi

# torch 2.x (#48): the Debian unstable root whose python3 (torch 2.x,
# transformers, accelerate) runs the torch 2.x tests' trainers through
# scripts/sid-python. Built once into ~/.cache/spotagent-sid from this
# machine's own Debian mirror (scripts/sid-root.sh: debootstrap, then
# apt-get in a chroot; cold about 10 min and 2.4 GB on 2 cores), instant
# when cached; a root that cannot be built fails the run here.
if ! root=$("$(dirname "$0")/sid-root.sh"); then
  echo "test-deps: the torch 2.x root could not be built (scripts/sid-root.sh)" >&2
  exit 1
fi
"$(dirname "$0")/sid-python" -c 'import torch, transformers, accelerate' || {
  echo "test-deps: the torch 2.x root at $root cannot import torch, transformers and accelerate" >&2
  exit 1
}
