#!/usr/bin/env bash
# Builds a Debian unstable (sid) root filesystem with torch 2.x, transformers
# and accelerate from Debian's own packages into a cache directory and prints
# the root's path. The torch 2.x tests run trainers with its python3 through
# scripts/sid-python; a second run finds the stamp and returns at once.
#
# The mirror is the one this machine's apt already uses (read from
# /etc/apt/sources.list and /etc/apt/sources.list.d at run time, so that no
# host name is written here): `debootstrap --variant=minbase sid`, then
# `apt-get install` in a chroot. Cold: see docs/frameworks.md (about 6 min
# and 2.3 GB on 2 cores). Runs as root (debootstrap and chroot need it).
#
#   SID_ROOT_DIR      cache root (default ${XDG_CACHE_HOME:-~/.cache}/spotagent-sid)
#   SID_MIRROR        mirror URL (default: the first Debian mirror apt uses)
set -euo pipefail

cache=${SID_ROOT_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/spotagent-sid}
root="$cache/root"
# What the torch 2.x tests need in the root (python3-venv: test_install's
# fresh venv). A root built from an older list gets what this one adds
# installed into it (a minute); a missing root is built (about 20 min).
packages=(python3 python3-torch python3-transformers python3-accelerate python3-numpy python3-venv)
want="packages: ${packages[*]}"

built() {
  [ -f "$cache/stamp" ] && [ -x "$root/usr/bin/python3" ] &&
    [ "$(head -n1 "$cache/stamp")" = "$want" ]
}

if built; then echo "$root"; exit 0; fi

fail() { echo "sid-root: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || fail "must run as root (debootstrap and chroot)"

mkdir -p "$cache"
# One build at a time (parallel test binaries, two checkouts): the second
# waits and then finds the stamp.
exec 9>"$cache/lock"
flock 9
if built; then echo "$root"; exit 0; fi

if ! command -v debootstrap >/dev/null 2>&1; then
  echo "sid-root: installing debootstrap" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >&2
fi

# The first http(s) URI of a Debian suite (not -security) that apt uses:
# deb822 .sources files ("URIs:" then "Suites:") and one-line .list files.
mirror() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk '
      /^[[:space:]]*$/ { if (u != "" && s !~ /security/) { print u; exit } u = ""; s = ""; next }
      $1 == "URIs:" { u = $2 }
      $1 == "Suites:" { s = $0 }
      END { if (u != "" && s !~ /security/) print u }
    ' "$f"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk '$1 == "deb" && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) { print $i; exit } }' "$f"
  done
}
url=${SID_MIRROR:-$(mirror | grep -E '/debian/?$' | head -n1 || true)}
[ -n "$url" ] || fail "no Debian mirror in /etc/apt/sources.list(.d); set SID_MIRROR"

# apt-get install the packages into root DIR, in a private mount namespace
# (the mounts vanish with it).
install_into() {
  cp /etc/resolv.conf "$1/etc/resolv.conf"
  # shellcheck disable=SC2016 # expanded by the inner shell
  unshare -m --propagation private /bin/sh -ec '
    r=$1; shift
    mount -t proc proc "$r/proc"
    mount --rbind /dev "$r/dev"
    mount --rbind /sys "$r/sys"
    chroot "$r" /usr/bin/env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    chroot "$r" /usr/bin/env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends "$@"
    chroot "$r" apt-get clean
  ' sh "$1" "${packages[@]}" >&2 || fail "apt-get install ${packages[*]} in the sid root failed"
}

# The versions root DIR's python3 imports (stdout only: torch's UCX writes
# its complaints to stdout too, so the last line).
versions_of() {
  # shellcheck disable=SC2016 # expanded by the inner shell
  unshare -m --propagation private /bin/sh -c '
    mount -t proc proc "$1/proc"
    exec chroot "$1" /usr/bin/python3 -c "
import sys, torch, transformers, accelerate
print(\"python\", sys.version.split()[0], \"torch\", torch.__version__,
      \"transformers\", transformers.__version__, \"accelerate\", accelerate.__version__)
"' sh "$1" | tail -n1 || fail "the sid root's python3 cannot import torch, transformers and accelerate"
}

stamp() { # stamp HOW
  {
    echo "$want"
    echo "$versions"
    echo "$1 $(date -u +%FT%TZ) in $(($(date +%s) - start)) s from $url, $(du -sh "$root" | cut -f1)"
  } >"$cache/stamp"
  echo "sid-root: $versions ($(tail -n1 "$cache/stamp"))" >&2
}

start=$(date +%s)
# A root built from an older list: install what this one adds.
if [ -x "$root/usr/bin/python3" ] && [ -f "$cache/stamp" ]; then
  echo "sid-root: installing ${packages[*]} into $root (was $(head -n1 "$cache/stamp"))" >&2
  install_into "$root"
  versions=$(versions_of "$root")
  stamp updated
  echo "$root"
  exit 0
fi

tmp="$cache/root.tmp"
rm -rf "$root" "$cache/stamp"
# A finished debootstrap is kept across a failed apt-get (the marker).
if [ ! -f "$tmp/.sid-debootstrap-ok" ]; then
  rm -rf "$tmp"
  echo "sid-root: debootstrap sid from $url into $tmp" >&2
  debootstrap --variant=minbase sid "$tmp" "$url" >&2 ||
    fail "debootstrap sid from $url failed (see $tmp/debootstrap/debootstrap.log)"
  : >"$tmp/.sid-debootstrap-ok"
fi
# The machine's mirror may serve a snapshot whose Release file is past its
# Valid-Until (apt refuses it then); the signatures are still checked.
echo 'Acquire::Check-Valid-Until "false";' >"$tmp/etc/apt/apt.conf.d/99spotagent-snapshot"
install_into "$tmp"
versions=$(versions_of "$tmp")
: >"$tmp/.spotagent-sid-root" # scripts/sid-python: "already inside"
mv "$tmp" "$root"
stamp built
echo "$root"
