#!/bin/bash
# spotagent EC2 user-data: install spotagent, write /etc/spotagent/<run-id>.env,
# install spotagent@.service and start spotagent@<run-id>. Paste as user-data
# (or a launch template's), after editing the variables below.
#
# Relaunch-safe: an ASG or spot fleet that replaces the instance runs this
# again on a fresh machine; the run id is the same (tag or RUN_ID below), so
# spotagent restores the latest committed checkpoint from the store and the
# trainer resumes. The run id is deliberately NOT the instance id: a new
# instance has a new id and would start the run from scratch. Running the
# script twice on one instance changes nothing (the unit is restarted only if
# the binary or its files changed). Needs: bash, curl, sha256sum, systemd,
# useradd; the aws CLI for s3:// release URLs.
set -euo pipefail

# ---- edit these -------------------------------------------------------------
# The spotagent release: a pinned version (never "latest": every instance of
# a run must get the same binary), from a directory (https://, s3:// or
# file://) that holds spotagent-linux-amd64, spotagent-linux-arm64 and
# SHA256SUMS, as `make release` writes them to dist/.
SPOTAGENT_VERSION="${SPOTAGENT_VERSION:-v0.1.0}"
SPOTAGENT_RELEASE_URL="${SPOTAGENT_RELEASE_URL:-https://github.com/spotagent/spotagent/releases/download/$SPOTAGENT_VERSION}"
# Optional overrides: the binary's URL, and its sha256 (hex). Pinning the
# sha256 here is stronger than SHA256SUMS (which comes from the same place as
# the binary): set it from a SHA256SUMS you checked. An unverified binary is
# refused unless ALLOW_UNVERIFIED=1 (for testing only).
SPOTAGENT_BINARY_URL="${SPOTAGENT_BINARY_URL:-}"
SPOTAGENT_BINARY_SHA256="${SPOTAGENT_BINARY_SHA256:-}"
ALLOW_UNVERIFIED="${ALLOW_UNVERIFIED:-0}"
# The user the agent and the trainer run as. "spotagent" is created as a
# system user (in the video and render groups when they exist, for GPU device
# nodes); any other name must exist; "root" runs as root (not recommended).
# The trainer's code and data must be readable by this user.
RUN_AS_USER="${RUN_AS_USER:-spotagent}"
# Checkpoints go to STORE_PREFIX/<run id> (s3://, gs:// or a local path).
STORE_PREFIX="${STORE_PREFIX:-s3://my-bucket/runs}"
# Run id: the instance tag RUN_ID_TAG wins when readable (launch template:
# "InstanceMetadataTags": "enabled", and tag propagation in the ASG); else RUN_ID.
RUN_ID_TAG="${RUN_ID_TAG:-spotagent:run-id}"
RUN_ID="${RUN_ID:-}"
# One shell command line, run by /bin/sh -c as RUN_AS_USER under the unit's sandbox.
TRAIN_COMMAND="${TRAIN_COMMAND:-cd /opt/train && exec python3 train.py}"
# Extra KEY=VALUE lines for the env file (spotagent flags or trainer env).
EXTRA_ENV="${EXTRA_ENV:-SPOTAGENT_LOG_LEVEL=info}"
# ---- end of settings --------------------------------------------------------

# Test hooks: install under a different root / use a fake metadata server.
ROOT="${SPOTAGENT_ROOT:-}"
IMDS_ENDPOINT="${IMDS_ENDPOINT:-http://169.254.169.254}"

BIN="$ROOT/usr/local/bin/spotagent"
UNIT_FILE="$ROOT/etc/systemd/system/spotagent@.service"

log() { echo "spotagent-user-data: $*" >&2; }
die() { log "error: $*"; exit 1; }

[[ -n "$ROOT" || "$(id -u)" -eq 0 ]] || die "must run as root"

# imds PATH: print an IMDSv2 metadata value; fails on 404 or no IMDS.
imds_token=""
imds() {
  if [[ -z "$imds_token" ]]; then
    imds_token="$(curl -fsS --connect-timeout 2 --max-time 5 --retry 3 \
      -X PUT -H "X-aws-ec2-metadata-token-ttl-seconds: 300" \
      "$IMDS_ENDPOINT/latest/api/token")" || return 1
  fi
  curl -fsS --connect-timeout 2 --max-time 5 --retry 3 \
    -H "X-aws-ec2-metadata-token: $imds_token" "$IMDS_ENDPOINT/latest/meta-data/$1"
}

# envq VALUE: VALUE double-quoted for a systemd EnvironmentFile.
envq() {
  local s="$1"
  s="${s//\\/\\\\}"; s="${s//\"/\\\"}"; s="${s//\$/\\\$}"; s="${s//\`/\\\`}"
  printf '"%s"' "$s"
}

# install_if_changed SRC DST MODE: replace DST atomically; exit 0 if changed.
install_if_changed() {
  if [[ -f "$2" ]] && cmp -s "$1" "$2"; then
    rm -f "$1"
    return 1
  fi
  chmod "$3" "$1"
  mv -f "$1" "$2"
}

# --- run id and store --------------------------------------------------------
tag_value="$(imds "tags/instance/$RUN_ID_TAG" 2>/dev/null)" || tag_value=""
if [[ -n "$tag_value" ]]; then
  log "run id from instance tag $RUN_ID_TAG"
  RUN_ID="$tag_value"
fi
[[ -n "$RUN_ID" ]] || die "no run id: set RUN_ID or tag the instance with $RUN_ID_TAG"
[[ "$RUN_ID" =~ ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$ ]] ||
  die "run id '$RUN_ID' must match [A-Za-z0-9][A-Za-z0-9._-]*"
STORE="${STORE_PREFIX%/}/$RUN_ID"
for v in "$STORE" "$TRAIN_COMMAND"; do
  [[ "$v" != *$'\n'* ]] || die "STORE_PREFIX and TRAIN_COMMAND cannot contain newlines"
done
[[ -n "$TRAIN_COMMAND" ]] || die "TRAIN_COMMAND is empty"
log "run id $RUN_ID, store $STORE"

# --- binary ------------------------------------------------------------------
# fetch URL DEST: download over https:// / file:// (curl) or s3:// (aws CLI).
fetch() {
  case "$1" in
    s3://*)
      command -v aws >/dev/null ||
        die "$1 is an s3:// URL and the aws CLI is not installed (install it, or use https://)"
      aws s3 cp --only-show-errors "$1" "$2" ;;
    *) curl -fsSL --retry 5 --retry-connrefused -o "$2" "$1" ;;
  esac
}

case "$(uname -m)" in
  x86_64 | amd64) arch=amd64 ;;
  aarch64 | arm64) arch=arm64 ;;
  *) die "no spotagent release for architecture $(uname -m)" ;;
esac
asset="spotagent-linux-$arch"
release="${SPOTAGENT_RELEASE_URL%/}"
binary_url="${SPOTAGENT_BINARY_URL:-$release/$asset}"

mkdir -p "$(dirname "$BIN")" "$(dirname "$UNIT_FILE")" "$ROOT/etc/spotagent"
tmp=""
trap 'rm -f "$tmp"' EXIT
want_sha="${SPOTAGENT_BINARY_SHA256,,}"
if [[ -z "$want_sha" && -z "$SPOTAGENT_BINARY_URL" ]]; then
  tmp="$(mktemp "$BIN.XXXXXX")"
  if fetch "$release/SHA256SUMS" "$tmp"; then
    want_sha="$(while read -r sum name; do
      if [[ "${name#\*}" == "$asset" ]]; then echo "${sum,,}"; fi
    done < "$tmp")"
    [[ -n "$want_sha" ]] || die "$release/SHA256SUMS lists no $asset"
  fi
  rm -f "$tmp"
fi
[[ -z "$want_sha" || "$want_sha" =~ ^[0-9a-f]{64}$ ]] || die "bad sha256 '$want_sha' for $asset"

changed=0
if [[ -n "$want_sha" && -x "$BIN" ]] &&
  [[ "$(sha256sum "$BIN" | cut -d' ' -f1)" == "$want_sha" ]]; then
  log "spotagent binary already installed ($SPOTAGENT_VERSION $arch)"
else
  if [[ -z "$want_sha" ]]; then
    [[ "$ALLOW_UNVERIFIED" == 1 ]] ||
      die "no sha256 for $binary_url (no SHA256SUMS, no SPOTAGENT_BINARY_SHA256): refusing an unverified binary; ALLOW_UNVERIFIED=1 overrides"
    log "warning: ALLOW_UNVERIFIED=1: installing $binary_url unverified"
  fi
  tmp="$(mktemp "$BIN.XXXXXX")"
  fetch "$binary_url" "$tmp" || die "download $binary_url failed"
  if [[ -n "$want_sha" ]]; then
    echo "$want_sha  $tmp" | sha256sum -c --quiet - || die "sha256 mismatch for $binary_url"
  fi
  chmod 0755 "$tmp"
  mv -f "$tmp" "$BIN"
  changed=1
  log "installed $BIN ($binary_url)"
fi

# --- user --------------------------------------------------------------------
# A drop-in sets User=; without one (RUN_AS_USER=root) the unit runs as root.
DROPIN_DIR="$UNIT_FILE"
DROPIN_DIR="${DROPIN_DIR%@.service}@$RUN_ID.service.d"
DROPIN="$DROPIN_DIR/10-user.conf"
if [[ "$RUN_AS_USER" == root ]]; then
  log "warning: RUN_AS_USER=root: the trainer runs as root"
  if [[ -e "$DROPIN" ]]; then rm -f "$DROPIN"; changed=1; fi
else
  [[ "$RUN_AS_USER" =~ ^[a-z_][a-z0-9_-]{0,31}$ ]] || die "RUN_AS_USER '$RUN_AS_USER' is not a user name"
  if ! getent passwd "$RUN_AS_USER" >/dev/null; then
    [[ "$RUN_AS_USER" == spotagent ]] || die "user $RUN_AS_USER does not exist"
    groups=""
    for g in video render; do
      if getent group "$g" >/dev/null; then groups="${groups:+$groups,}$g"; fi
    done
    useradd_args=(--system --user-group --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin)
    if [[ -n "$groups" ]]; then useradd_args+=(--groups "$groups"); fi
    useradd "${useradd_args[@]}" spotagent
    log "created system user spotagent"
  fi
  mkdir -p "$DROPIN_DIR"
  dropin_tmp="$(mktemp "$DROPIN.XXXXXX")"
  printf '%s\n' "# Written by spotagent EC2 user-data (RUN_AS_USER)." "[Service]" \
    "User=$RUN_AS_USER" "# A non-root service needs no capabilities at all." \
    "CapabilityBoundingSet=" > "$dropin_tmp"
  if install_if_changed "$dropin_tmp" "$DROPIN" 0644; then changed=1; fi
fi

# --- unit and env file -------------------------------------------------------
unit_tmp="$(mktemp "$UNIT_FILE.XXXXXX")"
# Identical to deploy/systemd/spotagent@.service (a test keeps them in sync).
cat > "$unit_tmp" <<'SPOTAGENT_UNIT'
# spotagent@.service: run one training job under spotagent on a VM.
#
# The instance name is the run name: `systemctl enable --now spotagent@exp42`
# reads /etc/spotagent/exp42.env (see example.env), keeps local checkpoints in
# /var/lib/spotagent/exp42 and serves the trainer socket at
# /run/spotagent/exp42/agent.sock (`spotagent status --socket ...` works on it).
#
# Stop sequence (KillMode=mixed): systemd sends SIGTERM to spotagent only; it
# treats it as an interruption notice, asks the trainer for a final checkpoint,
# uploads it within --term-grace, then stops the trainer (SIGTERM, SIGKILL after
# --kill-after). systemd SIGKILLs whatever is left after TimeoutStopSec, which
# must stay above term-grace + kill-after (the tests check it).
#
# Runs as root unless a drop-in sets User= (ec2/user-data.sh writes one for
# RUN_AS_USER, default "spotagent"): `systemctl edit spotagent@exp42` ->
#   [Service]
#   User=spotagent
#   CapabilityBoundingSet=
[Unit]
Description=spotagent training run %i
Documentation=https://github.com/spotagent/spotagent/tree/main/deploy
Wants=network-online.target
After=network-online.target nvidia-persistenced.service
# A trainer that keeps failing stops being restarted after 5 tries in an hour.
StartLimitIntervalSec=1h
StartLimitBurst=5

[Service]
Type=exec
# Defaults; /etc/spotagent/%i.env overrides any of them (EnvironmentFile= wins
# over Environment=). The env file is required: a missing file fails the start.
Environment=SPOTAGENT_RUN_ID=%i
Environment=SPOTAGENT_CHECKPOINT_DIR=%S/spotagent/%i
Environment=SPOTAGENT_SOCKET=%t/spotagent/%i/agent.sock
Environment=SPOTAGENT_TERM_GRACE=25s
Environment=SPOTAGENT_KILL_AFTER=5s
Environment=SPOTAGENT_LOG_FORMAT=console
# Framework caches (pip, Hugging Face, torch hub) must be writable under
# ProtectSystem=strict: point XDG_CACHE_HOME at the unit's cache directory.
Environment=XDG_CACHE_HOME=%C/spotagent/%i
# A writable HOME (Triton, wandb, ~/.config): /root and /home are read-only
# here. Not under the checkpoint directory, which the agent manages.
Environment=HOME=%S/spotagent-home/%i
EnvironmentFile=/etc/spotagent/%i.env
# TRAIN_COMMAND is one shell command line (for example
# "cd /opt/train && exec python train.py --lr 3e-4"). systemd substitutes
# "${TRAIN_COMMAND}" as a single argument without re-expanding it, and
# /bin/sh -c parses it, so quoting, $VARS and && behave as in a shell.
# An empty command would make spotagent exit at once with success: refuse it.
ExecStartPre=/bin/sh -c 'test -n "$$TRAIN_COMMAND" || { echo "TRAIN_COMMAND is empty or missing in /etc/spotagent/%i.env" >&2; exit 1; }'
# NoNewPrivileges=yes makes the setuid nvidia-modprobe that CUDA calls on first
# use powerless, so /dev/nvidia-uvm would never appear: create it before the
# trainer starts, with full privileges ("+"), ignoring failure ("-": no GPU, no
# driver, or nvidia-modprobe not installed).
ExecStartPre=-+/usr/bin/nvidia-modprobe -u -c0
ExecStart=/usr/local/bin/spotagent run -- /bin/sh -c "${TRAIN_COMMAND}"
KillMode=mixed
KillSignal=SIGTERM
TimeoutStopSec=90s
# Exit 75 (EX_TEMPFAIL) means "interrupted, checkpoint committed, run me
# again": spotagent run exits with it after an interruption stop. It is not a
# success (never list it in SuccessExitStatus=): Restart=on-failure restarts
# on it, and RestartForceExitStatus=75 keeps it restarting even if a drop-in
# changes Restart=. The restart resumes from the store. A manual stop (or
# shutdown) is never restarted, whatever the exit status.
# Exit 76 means a newer session (the ASG's replacement, started before this
# instance ends) took the run over through the store's lease: restarting would
# take it back and fence the newer one, so it is never restarted.
# Exit 126/127: the trainer command is not executable / not found, and 2: bad
# usage (a flag or SPOTAGENT_* value in the env file that is not allowed, or
# the trainer's own usage error). They fail the same way every time: a restart
# would only loop; fix the env file and start the unit again.
Restart=on-failure
RestartForceExitStatus=75
RestartPreventExitStatus=2 76 126 127
RestartSec=15s
SyslogIdentifier=spotagent-%i

# Writable paths: StateDirectory= and CacheDirectory= are created, owned and
# made writable despite ProtectSystem=strict; RuntimeDirectory= holds the socket.
StateDirectory=spotagent/%i
StateDirectory=spotagent-home/%i
CacheDirectory=spotagent/%i
RuntimeDirectory=spotagent/%i
# Other paths the trainer writes (datasets, logs) go in a drop-in:
#   systemctl edit spotagent@exp42  ->  [Service] ReadWritePaths=/data

# Hardening that leaves a GPU trainer working. Deliberately NOT set:
# PrivateDevices (CUDA needs /dev/nvidia*), MemoryDenyWriteExecute (CUDA,
# Triton and torch.compile JIT), ProtectClock (it restricts device access),
# DevicePolicy/DeviceAllow (same), PrivateUsers and SystemCallFilter (driver
# ioctls, pinned memory), RestrictAddressFamilies (NCCL, EFA and InfiniBand
# use more than inet sockets), ProcSubset=pid (frameworks read /proc/meminfo).
# `systemd-analyze security --offline=true`: 8.1 EXPOSED before these
# settings; see deploy/README.md for the current figures.
NoNewPrivileges=yes
ProtectSystem=strict
# Read-only, as strict already makes it: code and virtualenvs in /home work.
ProtectHome=read-only
# nvidia_uvm is loaded by the ExecStartPre above, before this applies.
ProtectKernelModules=yes
ProtectProc=invisible
RestrictNamespaces=yes
PrivateMounts=yes
SystemCallArchitectures=native
RemoveIPC=yes
PrivateTmp=yes
ProtectKernelTunables=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectHostname=yes
RestrictSUIDSGID=yes
RestrictRealtime=yes
LockPersonality=yes
UMask=0027
# GPU / EFA training needs pinned memory and many file descriptors
# (limits.conf does not apply to services).
LimitMEMLOCK=infinity
LimitNOFILE=1048576

[Install]
WantedBy=multi-user.target
SPOTAGENT_UNIT
if install_if_changed "$unit_tmp" "$UNIT_FILE" 0644; then changed=1; fi

ENV_FILE="$ROOT/etc/spotagent/$RUN_ID.env"
env_tmp="$(mktemp "$ENV_FILE.XXXXXX")"
{
  echo "# Written by spotagent EC2 user-data; rewritten on every run of it."
  echo "SPOTAGENT_STORE=$(envq "$STORE")"
  echo "SPOTAGENT_RUN_ID=$(envq "$RUN_ID")"
  # Every run under the prefix shares one fleet (docs/fleet.md).
  echo "SPOTAGENT_FLEET=$(envq "${STORE_PREFIX%/}")"
  echo "TRAIN_COMMAND=$(envq "$TRAIN_COMMAND")"
  if [[ -n "$EXTRA_ENV" ]]; then printf '%s\n' "$EXTRA_ENV"; fi
} > "$env_tmp"
if install_if_changed "$env_tmp" "$ENV_FILE" 0600; then changed=1; fi

# --- start -------------------------------------------------------------------
unit="spotagent@$RUN_ID.service"
systemctl daemon-reload
systemctl enable "$unit"
# --no-block: this script runs inside cloud-final.service; never wait on a job.
if systemctl is-active --quiet "$unit"; then
  if [[ "$changed" -eq 1 ]]; then
    log "configuration changed, restarting $unit"
    systemctl restart --no-block "$unit"
  else
    log "$unit already running with this configuration"
  fi
else
  systemctl reset-failed "$unit" 2>/dev/null || true
  systemctl start --no-block "$unit"
  log "started $unit"
fi
