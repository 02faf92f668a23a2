{{/* The fleet: the value, else the store's parent (s3://b/runs/exp42 -> s3://b/runs). */}}
{{- define "spotagent.fleet" -}}
{{- if .Values.fleet -}}
{{- .Values.fleet -}}
{{- else if regexMatch "^[a-z0-9]+://[^/]*/.*[^/]" .Values.store -}}
{{- regexReplaceAll "/+[^/]+/*$" .Values.store "" -}}
{{- else -}}
{{- .Values.store -}}
{{- end -}}
{{- end -}}

{{- define "spotagent.serviceAccountName" -}}
{{- default (printf "%s-trainer" .Values.runId) .Values.serviceAccount.name -}}
{{- end -}}

{{/* Seconds the pod needs after SIGTERM (deploy/README.md, "Drains"). */}}
{{- define "spotagent.grace" -}}
{{- $g := .Values.grace -}}
{{- add $g.sigtermWait $g.termGrace $g.killAfter $g.margin -}}
{{- end -}}

{{/* Labels on the workload object (Job, JobSet): the run and the Kueue queue. */}}
{{- define "spotagent.workloadLabels" -}}
app.kubernetes.io/name: trainer
spotagent.io/run-id: {{ .Values.runId }}
{{- with .Values.kueue.queueName }}
kueue.x-k8s.io/queue-name: {{ . }}
{{- end }}
{{- end -}}

{{/* Labels on the run's pods; spotagent.io/run-id is half of what the
NetworkPolicy admits by. Then podLabels, and AKS workload identity's label
(its webhook mutates only pods that carry it). */}}
{{- define "spotagent.podLabels" -}}
app.kubernetes.io/name: trainer
app.kubernetes.io/component: training
spotagent.io/run-id: {{ .Values.runId }}
{{- with .Values.podLabels }}
{{ toYaml . }}
{{- end }}
{{- if and (eq .Values.cloud.provider "aks") .Values.cloud.identity }}
azure.workload.identity/use: "true"
{{- end }}
{{- end -}}

{{/* The cloud preset's spot pool label, under nodeSelector's. */}}
{{- define "spotagent.nodeSelector" -}}
{{- $sel := dict -}}
{{- $p := .Values.cloud.provider -}}
{{- if eq $p "aks" }}{{ $_ := set $sel "kubernetes.azure.com/scalesetpriority" "spot" }}{{ end -}}
{{- if eq $p "gke" }}{{ $_ := set $sel "cloud.google.com/gke-spot" "true" }}{{ end -}}
{{- if eq $p "eks" }}{{ $_ := set $sel "eks.amazonaws.com/capacityType" "SPOT" }}{{ end -}}
{{- $sel = merge (deepCopy (.Values.nodeSelector | default dict)) $sel -}}
{{- if $sel }}
nodeSelector:
  {{- toYaml $sel | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The ServiceAccount's annotations: serviceAccount.annotations, then the
cloud preset's workload identity. */}}
{{- define "spotagent.serviceAccountAnnotations" -}}
{{- $a := deepCopy (.Values.serviceAccount.annotations | default dict) -}}
{{- with .Values.cloud.identity -}}
{{- $key := get (dict "aks" "azure.workload.identity/client-id" "gke" "iam.gke.io/gcp-service-account" "eks" "eks.amazonaws.com/role-arn") $.Values.cloud.provider -}}
{{- if $key }}{{ $_ := set $a $key . }}{{ end -}}
{{- end -}}
{{- if $a }}{{ toYaml $a }}{{ end -}}
{{- end -}}

{{- define "spotagent.tolerations" -}}
{{- $s := .Values.spot -}}
{{- $p := .Values.cloud.provider -}}
{{- if or $s.gke (eq $p "gke") }}
- key: cloud.google.com/gke-spot
  operator: Equal
  value: "true"
  effect: NoSchedule
- key: cloud.google.com/gke-preemptible
  operator: Equal
  value: "true"
  effect: NoSchedule
{{- end }}
{{- if or $s.aks (eq $p "aks") }}
- key: kubernetes.azure.com/scalesetpriority
  operator: Equal
  value: spot
  effect: NoSchedule
{{- end }}
{{- if $s.gpu }}
- key: nvidia.com/gpu
  operator: Exists
  effect: NoSchedule
{{- end }}
{{- with $s.extraTolerations }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* A required node affinity admitting any cloud's spot pool (terms are ORed). */}}
{{- define "spotagent.spotAffinity" -}}
{{- $s := .Values.spot -}}
nodeAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    # nodeSelectorTerms are ORed: any spot pool on any cloud.
    nodeSelectorTerms:
      {{- if $s.eks }}
      - matchExpressions: # EKS managed node groups
          - key: eks.amazonaws.com/capacityType
            operator: In
            values: ["SPOT"]
      {{- end }}
      {{- if $s.karpenter }}
      - matchExpressions: # Karpenter
          - key: karpenter.sh/capacity-type
            operator: In
            values: ["spot"]
      {{- end }}
      {{- if $s.gke }}
      - matchExpressions: # GKE Spot VMs
          - key: cloud.google.com/gke-spot
            operator: In
            values: ["true"]
      - matchExpressions: # GKE preemptible VMs
          - key: cloud.google.com/gke-preemptible
            operator: In
            values: ["true"]
      {{- end }}
      {{- if $s.aks }}
      - matchExpressions: # AKS spot node pools
          - key: kubernetes.azure.com/scalesetpriority
            operator: In
            values: ["spot"]
      {{- end }}
{{- end -}}

{{/* The node rank's environment variable (the pod's completion index). */}}
{{- define "spotagent.rankEnv" -}}
- name: JOB_COMPLETION_INDEX
  valueFrom:
    fieldRef:
      fieldPath: metadata.annotations['batch.kubernetes.io/job-completion-index']
{{- end -}}
