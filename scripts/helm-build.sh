#!/usr/bin/env bash
# Builds Helm (helm.sh/helm/v4/cmd/helm) from the Go module proxy into a
# cache directory and prints the binary's path. The deploy tests run it
# (deploy/helm_test.go) and `make helm` (part of `make test`) builds it
# first, so the build never runs inside test-go's timeout. A second run finds
# the binary and returns at once; one build at a time (flock).
#
#   HELM_VERSION     Helm version (default v4.3.2)
#   HELM_CACHE_DIR   cache root (default ${XDG_CACHE_HOME:-~/.cache}/spotagent-helm)
set -euo pipefail

version=${HELM_VERSION:-v4.3.2}
go=${GO:-go}
root=${HELM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/spotagent-helm}
dir="$root/$version-$($go env GOVERSION)"
bin="$dir/bin/helm"

built() { [ -f "$dir/stamp" ] && [ -x "$bin" ]; }

if built; then echo "$bin"; exit 0; fi
mkdir -p "$dir"
exec 9>"$dir/lock"
flock 9
if built; then echo "$bin"; exit 0; fi

src="$dir/src"
rm -rf "$src"
mkdir -p "$src" "$dir/bin"
cd "$src"
export GOFLAGS=-mod=mod GOWORK=off GOTOOLCHAIN=local
cat >go.mod <<EOM
module spotagent.test/helm

go 1.26

require helm.sh/helm/v4 $version
EOM
# A blank import keeps `go mod tidy`-free resolution simple: go build of the
# command resolves the rest of the graph from helm's own go.mod.
$go mod download -x "helm.sh/helm/v4@$version" >/dev/null 2>&1 || true
$go build -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$version" \
  -o "$dir/bin/" helm.sh/helm/v4/cmd/helm >&2
"$bin" version >/dev/null
echo "helm.sh/helm/v4 $version $($go env GOVERSION)" >"$dir/stamp"
echo "$bin"
