{{/*
The pod spec of a run with spotagent as a native sidecar (the single-pod Job,
the multi-node Indexed Job and the JobSet). Arguments (a dict):
  root        the chart's top context
  multi       several nodes: node rank, heartbeats, torchrun
  runIdLabel  the label the controller sets to the run's name on every pod
  rank0       rank 0's DNS name (multi)
  subdomain   the pods' subdomain ("" when the controller sets it)
  runtime     Kubeflow Trainer's ClusterTrainingRuntime (multi): one pod spec
              for every TrainJob, so the run id is the pod's runIdLabel
              (SPOTAGENT_RUN_ID) at run time, not a value; the trainer
              container is `node` and runs `torchrun "$@"` (the TrainJob's
              args); its resources are the TrainJob's resourcesPerNode
*/}}
{{- define "spotagent.sidecarPodSpec" -}}
{{- $v := .root.Values -}}
{{- $multi := .multi -}}
{{- $hostCopies := eq $v.copies.where "hostPath" -}}
{{- $rt := .runtime | default false -}}
{{- $trainerName := ternary "node" "trainer" $rt -}}
serviceAccountName: {{ if $rt }}{{ $v.kubeflow.runtime.serviceAccountName }}{{ else }}{{ include "spotagent.serviceAccountName" .root }}{{ end }}
{{- with .subdomain }}
subdomain: {{ . }} # the headless Service: {{ $.rank0 }} is node 0
{{- end }}
restartPolicy: Never # required by podFailurePolicy
terminationGracePeriodSeconds: {{ include "spotagent.grace" .root }}
securityContext:
  runAsNonRoot: true
  runAsUser: {{ $v.trainer.uid }}
  runAsGroup: {{ $v.trainer.uid }}
  fsGroup: {{ $v.trainer.uid }}
  seccompProfile:
    type: RuntimeDefault
{{- if $v.spot.requireSpotNode }}
affinity:
  {{- include "spotagent.spotAffinity" .root | trim | nindent 2 }}
{{- end }}
tolerations:
  {{- include "spotagent.tolerations" .root | trim | nindent 2 }}
{{- include "spotagent.nodeSelector" .root }}
initContainers:
  {{- if $hostCopies }}
  # The node's copies (docs/kubernetes.md, "Copies that outlive the pods"):
  # <copies root>/<namespace>/{{ ternary "<TrainJob name>" $v.runId $rt }}/node-<rank> on the node (the
  # namespace: two runs of one name in two namespaces never share a
  # directory), made and handed to uid {{ $v.trainer.uid }} before the sidecar starts (a
  # hostPath directory is root's); a symbolic link on that path, or a
  # <namespace> or <run> directory that is not root's alone, is refused.
  # Other runs' copies whose newest file is {{ $v.copies.retainDays }} days old are removed. The
  # agent image's `spotagent prepare-copies` (internal/hostcopies): every
  # step through an os.Root on the hostPath, so no link and no rename by a
  # trainer meanwhile leads it outside. Runs as root with CHOWN,
  # DAC_OVERRIDE and FOWNER only.
  - name: copies
    image: {{ $v.image.agent }}
    imagePullPolicy: {{ $v.image.pullPolicy }}
    args:
      - prepare-copies
      - --root=/copies
      - --namespace=$(POD_NAMESPACE)
      {{- if $rt }}
      - --run=$(SPOTAGENT_RUN_ID)
      {{- else }}
      - --run={{ $v.runId }}
      {{- end }}
      {{- if $multi }}
      - --node=$(JOB_COMPLETION_INDEX)
      {{- else }}
      - --node=0
      {{- end }}
      - --uid={{ $v.trainer.uid }}
      - --retain-days={{ $v.copies.retainDays }}
    env:
      {{- include "spotagent.namespaceEnv" . | nindent 6 }}
      {{- if $multi }}
      {{- include "spotagent.rankEnv" .root | nindent 6 }}
      {{- if $rt }}
      {{- include "spotagent.runIdEnv" .runIdLabel | nindent 6 }}
      {{- end }}
      {{- end }}
    resources:
      requests:
        cpu: 10m
        memory: 16Mi
      limits:
        memory: 64Mi
    securityContext:
      runAsUser: 0
      runAsNonRoot: false
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities:
        drop: ["ALL"]
        add: ["CHOWN", "DAC_OVERRIDE", "FOWNER"]
    volumeMounts:
      - name: checkpoints
        mountPath: /copies
  {{- end }}
  - name: spotagent
    # The image `make image` builds, pushed to your registry (docs/kubernetes.md);
    # pin the digest in production.
    image: {{ $v.image.agent }}
    imagePullPolicy: {{ $v.image.pullPolicy }}
    restartPolicy: Always
    args:
      - sidecar
      {{- if $multi }}
      - --node-rank=$(JOB_COMPLETION_INDEX)
      {{- end }}
      - --socket=/var/run/spotagent/agent.sock
      - --checkpoint-dir=/checkpoints
      {{- with $v.copies.maxBytes }}
      - --local-max-bytes={{ . | int64 }}
      {{- end }}
      - --term-grace={{ $v.grace.termGrace }}s
      - --kill-after={{ $v.grace.killAfter }}s
      - --metrics-addr=:{{ $v.ports.metrics }}
      {{- if $multi }}
      # Heartbeats between the job's sidecars (docs/distributed.md): a fixed
      # port, so that the NetworkPolicy lets only the job's pods send to it;
      # with --peer-restore the peer tier listens on the same port (TCP).
      - --peer-listen=:{{ $v.ports.heartbeat }}
      {{- if $v.peerRestore.enabled }}
      - --peer-restore
      - --replicas={{ $v.peerRestore.replicas }}
      {{- end }}
      {{- end }}
      - --log-format=json
    env:
      {{- if $multi }}
      {{- include "spotagent.rankEnv" .root | nindent 6 }}
      {{- end }}
      {{- if $hostCopies }}
      {{- include "spotagent.namespaceEnv" . | nindent 6 }}
      {{- end }}
      # Stable across pod relaunches: the name the controller labels every
      # pod with, which {{ ternary "is the TrainJob's name" "the chart sets to the run id" $rt }}.
      {{- include "spotagent.runIdEnv" .runIdLabel | nindent 6 }}
      {{- if $rt }}
      # One prefix per TrainJob under kubeflow.runtime.storePrefix.
      - name: SPOTAGENT_STORE
        value: {{ printf "%s$(SPOTAGENT_RUN_ID)" $v.kubeflow.runtime.storePrefix | quote }}
      {{- else }}
      - name: SPOTAGENT_STORE
        value: {{ $v.store | quote }}
      {{- end }}
      {{- $fleet := include "spotagent.fleet" .root }}
      {{- if $rt }}{{ $fleet = $v.fleet | default (trimSuffix "/" $v.kubeflow.runtime.storePrefix) }}{{ end }}
      # One fleet for every run under the prefix: `spotagent fleet --store
      # {{ $fleet }}` reports on them all, and a new run's first
      # interval starts from their history (docs/fleet.md).
      - name: SPOTAGENT_FLEET
        value: {{ $fleet | quote }}
    ports:
      - name: metrics
        containerPort: {{ $v.ports.metrics }}
        protocol: TCP
      {{- if $multi }}
      - name: heartbeat
        containerPort: {{ $v.ports.heartbeat }}
        protocol: UDP
      {{- if $v.peerRestore.enabled }}
      - name: peer
        containerPort: {{ $v.ports.heartbeat }}
        protocol: TCP
      {{- end }}
      {{- end }}
    startupProbe:
      # Restoring a large checkpoint can take minutes: up to 30 min here.
      httpGet:
        path: /readyz
        port: metrics
      periodSeconds: 2
      failureThreshold: 900
    readinessProbe:
      httpGet:
        path: /readyz
        port: metrics
      periodSeconds: 10
    livenessProbe:
      httpGet:
        path: /healthz
        port: metrics
      periodSeconds: 20
      timeoutSeconds: 5
      failureThreshold: 3
    resources:
      requests:
        cpu: 250m
        memory: 256Mi
        ephemeral-storage: 1Gi # agent-tmp
      limits:
        memory: 1Gi
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities:
        drop: ["ALL"]
    volumeMounts:
      - name: agent-socket
        mountPath: /var/run/spotagent
      {{- include "spotagent.checkpointMount" . | nindent 6 }}
      - name: agent-tmp
        mountPath: /tmp
containers:
  {{- if $rt }}
  # The Trainer's torch plugin finds its container by this name.
  {{- end }}
  - name: {{ $trainerName }}
    image: {{ $v.image.trainer }}
    imagePullPolicy: {{ $v.image.pullPolicy }}
    {{- if $multi }}
    # The container's main process is this shell, PID 1 of the
    # container: a PID 1 drops a signal it has no handler for, so the shell
    # traps the kubelet's SIGTERM and forwards it to torchrun (which forwards
    # it to the ranks: SPOTAGENT_HANDLE_SIGTERM below). Every rank ends with
    # sys.exit(agent.exit_code), 75 after an interruption stop; torchrun
    # reports that as its own exit 1 (or waits in its exit barrier, 300 s in
    # torch 1.13, for a node whose torchrun was signalled), so the client
    # also writes 75 to SPOTAGENT_EXIT_FILE: once it says 75 the ranks have
    # stopped and the checkpoint is committed, and a torchrun still running
    # 10 s later is ended (SIGTERM, SIGKILL 5 s after: in the barrier it runs
    # no Python handler); the shell then exits 75 for torchrun's 1, 137 or
    # 143 (a crash stays 1 and counts against the crash budget). A fenced rank
    # (a newer copy of this node took the run) writes 76: the shell exits 76,
    # never 0 or 75, and that counts too.
    # A node that stops answering (no RST for the ranks to see): the sidecar,
    # which heartbeats the other nodes' sidecars, creates peer-lost beside
    # its socket; torchrun is then ended at once, and the shell exits 75.
    # Under the node agent instead of a sidecar, set
    # SPOTAGENT_PEER_LOST=/var/lib/spotagent/<run id>/node-<k>/peer-lost (the
    # run's directory: the node's socket directory is every run's); deploy/README.md.
    # integration/k8s_pid1_test.go runs this script as PID 1 of a PID
    # namespace.
    {{- if $rt }}
    # Here torchrun reads its node count, rank and rendezvous from the
    # Trainer's PET_* variables, and "$@" is the TrainJob's args: a TrainJob
    # on this runtime sets args, never command (its command would replace
    # this wrapper, and with it the exit-code rules).
    {{- end }}
    command:
      - sh
      - -c
      - |
        lost=${SPOTAGENT_PEER_LOST:-$(dirname "$SPOTAGENT_SOCKET")/peer-lost}
        rm -f "$SPOTAGENT_EXIT_FILE" "$lost"
        {{- if $rt }}
        torchrun "$@" &
        {{- else }}
        torchrun --nnodes={{ $v.nodes }} --nproc_per_node={{ $v.processesPerNode }} --node_rank=$(JOB_COMPLETION_INDEX) \
          --master_addr={{ .rank0 }} --master_port={{ $v.ports.rendezvous }} \
          {{ $v.trainer.torchrunArgs }} &
        {{- end }}
        pid=$!
        trap 'sig=1; kill -TERM $pid 2>/dev/null' TERM INT
        said() { cat "$SPOTAGENT_EXIT_FILE" 2>/dev/null; }
        stopped() { case "$(said)" in 75|76) return 0 ;; esac; [ -e "$lost" ]; }
        (while kill -0 $pid 2>/dev/null; do
          if [ -e "$lost" ]; then grace=0; elif stopped; then grace=10; else sleep 1; continue; fi
          sleep "$grace"; kill -TERM $pid 2>/dev/null; sleep 5; kill -KILL $pid 2>/dev/null; exit
        done) &
        c=
        while :; do
          sig=; wait $pid; r=$?
          if [ "$r" = 127 ] && [ -n "$c" ]; then break; fi
          c=$r
          if [ -z "$sig" ]; then break; fi
        done
        case "$c" in 1|137|143) if [ "$(said)" = 76 ]; then exit 76; elif stopped; then exit 75; fi ;; esac
        exit "$c"
      {{- if $rt }}
      - spotagent-torchrun # $0; the TrainJob's args follow
      {{- end }}
    {{- else }}
    # Ends with sys.exit(agent.exit_code): 75 after an interruption stop.
    command: {{ toJson $v.trainer.command }}
    {{- end }}
    env:
      {{- if $multi }}
      - name: SPOTAGENT_EXIT_FILE
        value: /tmp/spotagent-exit
      {{- include "spotagent.rankEnv" .root | nindent 6 }}
      {{- if $rt }}
      # The copies' subPathExpr below reads it.
      {{- include "spotagent.runIdEnv" .runIdLabel | nindent 6 }}
      {{- end }}
      {{- end }}
      {{- if $hostCopies }}
      {{- include "spotagent.namespaceEnv" . | nindent 6 }}
      {{- end }}
      - name: SPOTAGENT_SOCKET
        value: /var/run/spotagent/agent.sock
      # The trainer container gets SIGTERM before its sidecar (pod deletion,
      # node drain): the client turns it into a final checkpoint and exits
      # once the sidecar has committed it.
      - name: SPOTAGENT_HANDLE_SIGTERM
        value: "1"
      # Seconds to wait for that checkpoint to commit (the drain budget).
      - name: SPOTAGENT_SIGTERM_WAIT
        value: {{ $v.grace.sigtermWait | quote }}
      {{- if $multi }}
      # torch >= 2.x: how long torchrun lets the ranks finish after it
      # forwarded SIGTERM before it SIGKILLs them (LaunchConfig.shutdown_timeout;
      # default 30 s, shorter than the wait above). torch 1.13 ignores it (30 s).
      - name: TORCH_ELASTIC_SHUTDOWN_TIMEOUT
        value: {{ add $v.grace.sigtermWait 10 | quote }}
      {{- end }}
      {{- with $v.trainer.env }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
    {{- if not $rt }}
    resources:
      requests:
        {{- toYaml $v.trainer.resources.requests | nindent 8 }}
        {{- if $hostCopies }}
        ephemeral-storage: 10Gi # logs and the writable layer; the copies are on the hostPath
        {{- else }}
        # The checkpoints emptyDir plus logs and the writable layer: without
        # a request the scheduler reserves none of it.
        ephemeral-storage: {{ include "spotagent.plus10Gi" $v.copies.sizeLimit }}
        {{- end }}
      limits:
        {{- toYaml $v.trainer.resources.limits | nindent 8 }}
        {{- if $multi }}
        nvidia.com/gpu: {{ $v.gpusPerNode }}
        {{- else }}
        nvidia.com/gpu: 1
        {{- end }}
    {{- end }}
    securityContext:
      allowPrivilegeEscalation: false
      capabilities:
        drop: ["ALL"]
    volumeMounts:
      - name: agent-socket
        mountPath: /var/run/spotagent
      {{- include "spotagent.checkpointMount" . | nindent 6 }}
      - name: dshm # PyTorch DataLoader workers need a large /dev/shm
        mountPath: /dev/shm
volumes:
  - name: agent-socket
    emptyDir:
      medium: Memory
      sizeLimit: 1Mi
  - name: checkpoints
    {{- if $hostCopies }}
    # Outlives the pod: each pod mounts <runId>/node-<rank> of it.
    hostPath:
      path: {{ $v.copies.hostPath }}
      type: DirectoryOrCreate
    {{- else }}
    # Dies with the pod: a recreated pod restores from peers or the store.
    emptyDir:
      sizeLimit: {{ $v.copies.sizeLimit }}
    {{- end }}
  - name: agent-tmp
    emptyDir:
      sizeLimit: 1Gi
  - name: dshm
    emptyDir:
      medium: Memory
      sizeLimit: {{ $v.trainer.shmSize }}
{{- end -}}

{{/* The checkpoint directory's mount: the node's own subdirectory of the copies. */}}
{{- define "spotagent.checkpointMount" -}}
- name: checkpoints
  mountPath: /checkpoints
  {{- if eq .root.Values.copies.where "hostPath" }}
  {{- if .runtime }}
  subPathExpr: $(POD_NAMESPACE)/$(SPOTAGENT_RUN_ID)/node-$(JOB_COMPLETION_INDEX)
  {{- else if .multi }}
  subPathExpr: $(POD_NAMESPACE)/{{ .root.Values.runId }}/node-$(JOB_COMPLETION_INDEX)
  {{- else }}
  subPathExpr: $(POD_NAMESPACE)/{{ .root.Values.runId }}/node-0
  {{- end }}
  {{- end }}
{{- end -}}

{{/* An emptyDir size plus 10Gi for logs and the writable layer (Gi sizes). */}}
{{- define "spotagent.plus10Gi" -}}
{{- if hasSuffix "Gi" . -}}
{{- add (trimSuffix "Gi" . | int) 10 }}Gi
{{- else -}}
{{- . }}
{{- end -}}
{{- end -}}

{{/* The pod's namespace, the first element of the copies' subPathExpr
(every container that mounts them, and the copies init container). */}}
{{- define "spotagent.namespaceEnv" -}}
- name: POD_NAMESPACE # the copies are <copies root>/<namespace>/<run id>/node-<rank>
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end -}}

{{/* The run id's environment variable: the label the controller sets to
the run's name on every pod. */}}
{{- define "spotagent.runIdEnv" -}}
- name: SPOTAGENT_RUN_ID
  valueFrom:
    fieldRef:
      fieldPath: metadata.labels['{{ . }}']
{{- end -}}
