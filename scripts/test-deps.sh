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
nft                  nftables         bench/cmd/spotbench detect: random packet loss between network namespaces (no netem in this kernel)
chattr               e2fsprogs        internal/hostcopies: an undeletable stale run (chattr +i)
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

# Azurite, Microsoft's Azure Blob emulator, for the az:// store's tests
# (internal/testsrv/azuritetest starts it). From the npm registry, pinned:
# 3.35.0 is the newest release that runs on Node 20 (3.36 wants Node 21,
# 3.37 Node 22), Debian's nodejs. Installed once into the cache.
azurite_version=3.35.0
azurite_dir=${XDG_CACHE_HOME:-$HOME/.cache}/spotagent-azurite/$azurite_version
if [ ! -x "$azurite_dir/node_modules/.bin/azurite-blob" ]; then
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "installing test dependencies: nodejs npm (for Azurite)"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
  fi
  echo "installing Azurite $azurite_version into $azurite_dir"
  mkdir -p "$azurite_dir"
  npm install --silent --no-audit --no-fund --omit=dev --prefix "$azurite_dir" "azurite@$azurite_version" >/dev/null
fi
if ! "$azurite_dir/node_modules/.bin/azurite-blob" --version >/dev/null 2>&1; then
  echo "test-deps: Azurite $azurite_version in $azurite_dir does not run (node $(node --version 2>/dev/null || echo missing))" >&2
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
