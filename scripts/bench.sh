#!/usr/bin/env bash
# `make bench` (after `make build`): installs MinIO once into bench/cache/,
# builds bench/cmd/spotbench and runs it. It writes bench/RESULTS.md and
# prints the same report. Scratch data goes under $SPOTBENCH_WORK (default
# /tmp/spotbench) and is removed at the end. Never part of `make test`.
#
# Knobs (environment): SPOTBENCH_REPS (5), SPOTBENCH_E2E_REPS (3),
# SPOTBENCH_NOTICES (50), SPOTBENCH_IDLE (60s), SPOTBENCH_IDLE_RUNS (5),
# SPOTBENCH_KEEP_WORK (set: keep $SPOTBENCH_WORK, the agents' logs, for a
# post-mortem), SPOTBENCH_BASELINE_BIN (an older spotagent measured beside this one in
# the footprint and transfer sections),
# SPOTBENCH_ONLY (latency,transfer,e2e,footprint,simulate,pipeline,distributed,fleet,watch,overlap,peer,peernet,digest,azure,detect,k8s;
# azure builds azcopy once into ~/.cache/spotagent-azcopy and runs Azurite, cached as the tests cache it;
# k8s needs the control plane and controllers' cache (make kcp-controllers), SPOTBENCH_K8S_REPS (3);
# peernet needs root for its network namespaces, and says it skipped without; detect's netem rows need root too),
# SPOTBENCH_PIPELINE_GIB (1,4,8; a size without room is skipped with the reason), SPOTBENCH_OVERLAP_GIB (2), SPOTBENCH_TORCH_PYTHON (/usr/bin/python3),
# SPOTBENCH_FLEET_AGENTS (1000), SPOTBENCH_FLEET_RUNS (10000,100000), SPOTBENCH_FLEET_OLD_DEADLINE (2m),
# SPOTBENCH_PEER_MIB (1024: the peer section's checkpoint bytes per node),
# SPOTBENCH_PEERNET_MIB (1024: the peernet section's file; twice that in the work directory),
# SPOTBENCH_K8S_REPS (3: the k8s section's runs of deploy's TestK8sJobSetRestartReusesCopies, ~2-3 min
# each on 2 cores; the section says it skipped unless make kcp-controllers has built the control plane).
# recovery (issue 51: notice, lost node, whole-job restart, event → every rank's first
# resumed step; not in the default list: its 9 runs took 7–14 min on the loaded 2-core machine):
# SPOTBENCH_ONLY=recovery, SPOTBENCH_RECOVERY_REPS (3), SPOTBENCH_RECOVERY_MIB (128: per node),
# SPOTBENCH_RECOVERY_DELAY (2s: the orchestrator's restart delay modelled, deploy/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
CACHE=$PWD/bench/cache
WORK=${SPOTBENCH_WORK:-/tmp/spotbench}
MINIO=$CACHE/bin/minio
mkdir -p "$CACHE/bin"

for tool in aws curl python3; do
  command -v "$tool" >/dev/null || { echo "bench: $tool is required on PATH" >&2; exit 1; }
done
aws --version >/dev/null 2>&1 || { echo "bench: 'aws --version' fails: the AWS CLI is not usable" >&2; exit 1; }

ONLY=${SPOTBENCH_ONLY:-latency,transfer,e2e,footprint,simulate,pipeline,distributed,fleet,watch,overlap,peer,peernet,digest,azure,detect,k8s}
needs_minio=false # only these sections start MinIO
for s in transfer e2e pipeline distributed fleet; do
  case ",$ONLY," in *",$s,"*) needs_minio=true ;; esac
done
if $needs_minio && [ ! -x "$MINIO" ]; then
  echo "bench: installing MinIO into $CACHE/bin (one time, a few minutes)" >&2
  # From a temp dir: `go install pkg@version` ignores our go.mod, which must
  # not learn about MinIO.
  tmp=$(mktemp -d)
  (cd "$tmp" && GOBIN="$CACHE/bin" GOFLAGS=-mod=mod "$GO" install github.com/minio/minio@latest)
  rmdir "$tmp"
fi

AZCOPY=${SPOTBENCH_AZCOPY:-$HOME/.cache/spotagent-azcopy/azcopy}
AZCOPY_VERSION=v10.32.6 # the module's newest release on the proxy when the section was written
case ",$ONLY," in *",azure,"*)
  if [ ! -x "$AZCOPY" ]; then
    echo "bench: building azcopy $AZCOPY_VERSION into $(dirname "$AZCOPY") (one time)" >&2
    # In a module of its own (go install pkg@version asks the proxy for the
    # module's version list, which it refuses here); our go.mod never learns of it.
    # A failed build (no module proxy) does not end make bench: the azure
    # section then measures spotagent alone and says there was no azcopy.
    tmp=$(mktemp -d)
    mkdir -p "$(dirname "$AZCOPY")"
    if ! (cd "$tmp" && "$GO" mod init azcopybuild >/dev/null 2>&1 &&
      GOFLAGS=-mod=mod "$GO" get "github.com/Azure/azure-storage-azcopy/v10@$AZCOPY_VERSION" &&
      GOFLAGS=-mod=mod "$GO" build -o "$AZCOPY" github.com/Azure/azure-storage-azcopy/v10); then
      echo "bench: building azcopy $AZCOPY_VERSION failed: the azure section runs without it" >&2
    fi
    rm -rf "$tmp"
  fi ;;
esac

[ -x bin/spotagent ] || make build GO="$GO" # the shipped build: tags and flags matter for RSS
"$GO" build -o "$CACHE/bin/spotbench" ./bench/cmd/spotbench
"$GO" build -o "$CACHE/bin/watchbench" ./bench/cmd/watchbench

cleanup() { [ -n "${SPOTBENCH_KEEP_WORK:-}" ] || rm -rf "$WORK"; rm -rf /dev/shm/spotbench-minio /dev/shm/spotbench-minio-lean; }
trap cleanup EXIT
"$CACHE/bin/spotbench" -bin bin/spotagent -minio "$MINIO" -work "$WORK" -out bench/RESULTS.md \
  -reps "${SPOTBENCH_REPS:-5}" -e2e-reps "${SPOTBENCH_E2E_REPS:-3}" -notices "${SPOTBENCH_NOTICES:-50}" \
  -idle "${SPOTBENCH_IDLE:-60s}" -idle-runs "${SPOTBENCH_IDLE_RUNS:-5}" -baseline-bin "${SPOTBENCH_BASELINE_BIN:-}" -only "$ONLY" \
  -pipeline-gib "${SPOTBENCH_PIPELINE_GIB:-1,4,8}" -overlap-gib "${SPOTBENCH_OVERLAP_GIB:-2}" -watchbench "$CACHE/bin/watchbench" \
  -fleet-agents "${SPOTBENCH_FLEET_AGENTS:-1000}" -fleet-runs "${SPOTBENCH_FLEET_RUNS:-10000,100000}" \
  -fleet-reps "${SPOTBENCH_FLEET_REPS:-3}" -fleet-old-deadline "${SPOTBENCH_FLEET_OLD_DEADLINE:-2m}" \
  -peer-mib "${SPOTBENCH_PEER_MIB:-1024}" \
  -peernet-mib "${SPOTBENCH_PEERNET_MIB:-1024}" -azcopy "$AZCOPY" -k8s-reps "${SPOTBENCH_K8S_REPS:-3}" \
  -recovery-reps "${SPOTBENCH_RECOVERY_REPS:-3}" -recovery-mib "${SPOTBENCH_RECOVERY_MIB:-128}" \
  -recovery-restart-delay "${SPOTBENCH_RECOVERY_DELAY:-2s}"
