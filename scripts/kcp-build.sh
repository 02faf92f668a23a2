#!/usr/bin/env bash
# Builds a real Kubernetes control plane (etcd, kube-apiserver,
# kube-controller-manager, kubectl) from the Go module proxy into a cache
# directory and prints that directory's bin/. The deploy tests run it
# (deploy/k8s_test.go); a second run finds the binaries and returns at once.
#
# k8s.io/kubernetes is not meant to be required as a module: its go.mod
# replaces every k8s.io/<staging> module with ./staging/src/k8s.io/<name>. A
# scratch module written here requires it and replaces each of those with the
# published k8s.io/<name> v0.<minor>.<patch> instead (the list is read from
# its go.mod). etcd is built at the go.etcd.io/etcd/server/v3 version that
# Kubernetes requires. Cold: 6 min and 2.0 GB peak on 2 cores (empty
# module and build caches).
#
#   KCP_K8S_VERSION   Kubernetes version (default v1.35.4)
#   KCP_CACHE_DIR     cache root (default ${XDG_CACHE_HOME:-~/.cache}/spotagent-kcp)
set -euo pipefail

version=${KCP_K8S_VERSION:-v1.35.4}
go=${GO:-go}
root=${KCP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/spotagent-kcp}
dir="$root/$version-$($go env GOVERSION)"
bin="$dir/bin"
tools=(etcd kube-apiserver kube-controller-manager kubectl)

built() {
  [ -f "$dir/stamp" ] || return 1
  for t in "${tools[@]}"; do [ -x "$bin/$t" ] || return 1; done
}

if built; then echo "$bin"; exit 0; fi

mkdir -p "$dir"
# One build at a time (parallel test binaries, two checkouts): the second
# waits and then finds the binaries.
exec 9>"$dir/lock"
flock 9
if built; then echo "$bin"; exit 0; fi

staging_version="v0.${version#v1.}"
src="$dir/src"
rm -rf "$src"
mkdir -p "$src/etcd" "$bin"
cd "$src"
export GOFLAGS=-mod=mod GOWORK=off GOTOOLCHAIN=local

cat >go.mod <<EOF
module spotagent.test/kcp

go 1.26

require k8s.io/kubernetes $version
EOF
# etcd's own main package lives in the go.etcd.io/etcd/v3 module; its
# entrypoint is a library in server/v3, at the version Kubernetes requires.
cat >etcd/main.go <<'EOF'
// Command etcd is go.etcd.io/etcd/server/v3/etcdmain at the version
// k8s.io/kubernetes requires.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF

kmod=$($go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
[ -f "$kmod" ] || { echo "kcp-build: no go.mod for k8s.io/kubernetes@$version" >&2; exit 1; }
staging=$(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/src/.*#\1#p' "$kmod")
[ -n "$staging" ] || { echo "kcp-build: no staging replaces in $kmod" >&2; exit 1; }
edits=()
for m in $staging; do edits+=("-replace=$m=$m@$staging_version"); done
$go mod edit "${edits[@]}"
etcd_version=$(sed -n 's#^[[:space:]]*go\.etcd\.io/etcd/server/v3 \(v[^[:space:]]*\).*#\1#p' "$kmod" | head -n1)
[ -n "$etcd_version" ] || { echo "kcp-build: k8s.io/kubernetes requires no go.etcd.io/etcd/server/v3" >&2; exit 1; }
$go get "go.etcd.io/etcd/server/v3@$etcd_version" >&2

major=${version#v}; major=${major%%.*}
minor=${version#v*.}; minor=${minor%%.*}
ldflags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $p.gitVersion=$version -X $p.gitMajor=$major -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
done
$go build -trimpath -ldflags "$ldflags" -o "$bin/" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kubectl >&2
$go build -trimpath -ldflags "-s -w" -o "$bin/etcd" ./etcd >&2
echo "k8s.io/kubernetes $version etcd $etcd_version $($go env GOVERSION)" >"$dir/stamp"
echo "$bin"
