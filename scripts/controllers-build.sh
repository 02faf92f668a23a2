#!/usr/bin/env bash
# Builds the JobSet controller, the Kubeflow Trainer v2 controller manager
# and the Kueue controller manager from the Go module proxy into a cache
# directory, copies their CRDs (and the Trainer's shipped runtimes) beside
# them, and prints that directory. The deploy tests run it
# (deploy/k8s_trainer_test.go, deploy/k8s_kueue_test.go); a second run finds
# the binaries and returns at once.
#
# One scratch module requires all three at the versions Kueue requires
# (Kueue v0.17.0 requires Trainer v2.2.0 and JobSet v0.11.1), so that one
# `go build` compiles controller-runtime and client-go once for the Trainer
# and Kueue; the JobSet controller is built in its own module (below).
# The proxy refuses sigs.k8s.io/jobset's version list (403) but serves its
# versions by name; the version is pinned here, never discovered.
#
#   SPOTAGENT_KUEUE_VERSION    sigs.k8s.io/kueue (default v0.17.0)
#   SPOTAGENT_TRAINER_VERSION  github.com/kubeflow/trainer/v2 (default v2.2.0)
#   SPOTAGENT_JOBSET_VERSION   sigs.k8s.io/jobset (default v0.11.1)
#   --cached                   print the directory if built, else exit 3 (build nothing)
#   KCP_CACHE_DIR              cache root (default ${XDG_CACHE_HOME:-~/.cache}/spotagent-kcp)
set -euo pipefail

kueue=${SPOTAGENT_KUEUE_VERSION:-v0.17.0}
trainer=${SPOTAGENT_TRAINER_VERSION:-v2.2.0}
jobset=${SPOTAGENT_JOBSET_VERSION:-v0.11.1}
go=${GO:-go}
root=${KCP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/spotagent-kcp}
dir="$root/controllers-kueue-$kueue-trainer-$trainer-jobset-$jobset-$($go env GOVERSION)"
bin="$dir/bin"
tools=(jobset-controller trainer-controller-manager kueue)

built() {
  [ -f "$dir/stamp" ] || return 1
  for t in "${tools[@]}"; do [ -x "$bin/$t" ] || return 1; done
  [ -f "$dir/manifests-stamp" ] && [ -f "$dir/kueue-patch-stamp" ]
}

# Kueue with one line changed: with internalCertManagement off, Kueue's
# main reads the metrics server's certificate from the fixed path
# /etc/kueue/metrics/certs (where its cert-manager deployment mounts a
# Secret) and exits when it is absent, even with metrics off. The tests run
# it as a process, not in a pod, and never write /etc: the patch lets
# KUEUE_METRICS_CERT_DIR name that directory. Only cmd/kueue/main.go is
# copied (into the scratch module, as package main; Go refuses overlays of
# the module cache) and changed; every package it imports is Kueue's as the
# module proxy serves it.
build_kueue() {
  local ku main
  ku=$(cd "$dir/src" && GOFLAGS=-mod=mod GOWORK=off $go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)
  main="$ku/cmd/kueue/main.go"
  grep -q 'metricsCertPath := "/etc/kueue/metrics/certs"' "$main" ||
    { echo "controllers-build: $main no longer has the metrics certificate path this script patches" >&2; exit 1; }
  mkdir -p "$dir/src/kueue"
  sed 's|metricsCertPath := "/etc/kueue/metrics/certs"|metricsCertPath := "/etc/kueue/metrics/certs"; if d := os.Getenv("KUEUE_METRICS_CERT_DIR"); d != "" { metricsCertPath = d }|' \
    "$main" >"$dir/src/kueue/main.go"
  (cd "$dir/src" && GOFLAGS=-mod=mod GOWORK=off GOTOOLCHAIN=local \
    $go build -trimpath -ldflags "-s -w" -o "$bin/kueue" ./kueue) >&2
  touch "$dir/kueue-patch-stamp"
}

# The CRDs, the webhook configurations and the Trainer's own runtimes, as
# each module ships them, from the module cache of the scratch module.
copy_manifests() {
  moddir() { (cd "$dir/src" && GOFLAGS=-mod=mod GOWORK=off $go list -m -f '{{.Dir}}' "$1"); }
  local js tr ku
  js=$(moddir sigs.k8s.io/jobset)
  tr=$(moddir github.com/kubeflow/trainer/v2)
  ku=$(moddir sigs.k8s.io/kueue)
  rm -rf "$dir/crds" "$dir/webhooks" "$dir/trainer-runtimes"
  mkdir -p "$dir/crds/jobset" "$dir/crds/trainer" "$dir/crds/kueue" "$dir/webhooks" "$dir/trainer-runtimes"
  cp "$js"/config/components/crd/bases/*.yaml "$dir/crds/jobset/"
  cp "$tr"/manifests/base/crds/trainer.kubeflow.org_*.yaml "$dir/crds/trainer/"
  cp "$tr"/manifests/base/runtimes/*.yaml "$dir/trainer-runtimes/"
  cp "$tr"/manifests/base/webhook/manifests.yaml "$dir/webhooks/trainer.yaml"
  cp "$ku"/config/components/crd/bases/*.yaml "$dir/crds/kueue/"
  cp "$ku"/config/components/webhook/manifests.yaml "$dir/webhooks/kueue.yaml"
  chmod -R u+w "$dir/crds" "$dir/webhooks" "$dir/trainer-runtimes"
  touch "$dir/manifests-stamp"
}

if built; then echo "$dir"; exit 0; fi
# --cached: only say whether they are built (exit 3 when not); the deploy
# tests run the controllers' tests under make test when they are.
if [ "${1:-}" = --cached ]; then exit 3; fi

mkdir -p "$dir"
# One build at a time (parallel test binaries, two checkouts).
exec 9>"$dir/lock"
flock 9
if built; then echo "$dir"; exit 0; fi
# Binaries built by an earlier version of this script: the manifests only.
if [ -f "$dir/stamp" ] && [ -d "$dir/src" ]; then
  ok=1
  for t in "${tools[@]}"; do [ -x "$bin/$t" ] || ok=; done
  if [ -n "$ok" ]; then
    [ -f "$dir/manifests-stamp" ] || copy_manifests
    [ -f "$dir/kueue-patch-stamp" ] || build_kueue
    echo "$dir"; exit 0
  fi
fi

src="$dir/src"
rm -rf "$src" "$dir/crds"
mkdir -p "$src" "$bin"
cd "$src"
export GOFLAGS=-mod=mod GOWORK=off GOTOOLCHAIN=local

cat >go.mod <<EOF
module spotagent.test/controllers

go 1.26

require (
	github.com/kubeflow/trainer/v2 $trainer
	sigs.k8s.io/jobset $jobset
	sigs.k8s.io/kueue $kueue
)
EOF
# A file that imports the mains keeps `go mod tidy` from dropping their
# modules; the mains themselves are built by path.
cat >tools.go <<'EOF'
//go:build tools

package tools

import (
	_ "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"
	_ "sigs.k8s.io/jobset"
	_ "sigs.k8s.io/kueue/cmd/kueue"
)
EOF
$go mod tidy >&2
# Each requirement must have stayed at its pin: a higher one chosen by
# minimal version selection would build something other than the stamp says.
for m in "github.com/kubeflow/trainer/v2 $trainer" "sigs.k8s.io/jobset $jobset" "sigs.k8s.io/kueue $kueue"; do
  got=$($go list -m "${m% *}")
  [ "$got" = "$m" ] || { echo "controllers-build: want $m, module graph chose $got" >&2; exit 1; }
done

$go build -trimpath -ldflags "-s -w" -o "$bin/" \
  github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager >&2
build_kueue
# The JobSet controller in its own module, at its own requirements: JobSet
# v0.11.1's webhooks do not compile against the controller-runtime (v0.23)
# Kueue and the Trainer require (ctrl.NewWebhookManagedBy takes the object
# type since v0.23); its API types, which they import, do.
jsdir=$($go list -m -f '{{.Dir}}' sigs.k8s.io/jobset)
(cd "$jsdir" && GOFLAGS=-mod=readonly $go build -trimpath -ldflags "-s -w" -o "$bin/jobset-controller" .) >&2

copy_manifests
echo "kueue $kueue trainer $trainer jobset $jobset $($go env GOVERSION)" >"$dir/stamp"
echo "$dir"
