{{/* The release's name for its objects: the release name, or RELEASE-fleetcanary when it does not say fleetcanary. */}}
{{- define "fleetcanary.fullname" -}}
{{- if contains "fleetcanary" .Release.Name -}}
{{- .Release.Name | trunc 45 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-fleetcanary" .Release.Name | trunc 45 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The DaemonSet's selector. Claim pods are labelled app.kubernetes.io/name: fleetcanary-claim: never selected. */}}
{{- define "fleetcanary.selectorLabels" -}}
app.kubernetes.io/name: fleetcanary
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "fleetcanary.labels" -}}
{{ include "fleetcanary.selectorLabels" . }}
app.kubernetes.io/part-of: fleetcanary
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "fleetcanary.remediateSelectorLabels" -}}
app.kubernetes.io/name: fleetcanary-remediate
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "fleetcanary.remediateLabels" -}}
{{ include "fleetcanary.remediateSelectorLabels" . }}
app.kubernetes.io/part-of: fleetcanary
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "fleetcanary.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{- $flavour := ternary "cpu" .Values.image.flavour (and .Values.cpuOnly.enabled (eq .Values.image.flavour "cuda")) -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default (ternary .Chart.AppVersion (printf "%s-%s" .Chart.AppVersion $flavour) (eq $flavour "cuda")) }}
{{- end -}}
{{- end -}}

{{- define "fleetcanary.priorityClassName" -}}
{{- if .Values.priorityClass.create -}}
{{ .Values.priorityClass.name | default (include "fleetcanary.fullname" .) }}
{{- else -}}
{{ .Values.priorityClass.name }}
{{- end -}}
{{- end -}}

{{/* Runs as root: the kubelet's socket, the kernel log. */}}
{{- define "fleetcanary.root" -}}
{{- if or .Values.gpuAllocation.enabled .Values.xidWatch.enabled }}true{{ end -}}
{{- end -}}

{{/* The Pod Security level the enabled features need: a host path is beyond baseline. */}}
{{- define "fleetcanary.podSecurityLevel" -}}
{{- if or .Values.gpuAllocation.enabled .Values.xidWatch.enabled .Values.hostState.enabled .Values.scheduledRuns.enabled (and .Values.fabric.enabled .Values.fabric.rdma) (not (has (include "fleetcanary.gpuAccess" .) (list "runtime" "none"))) (include "fleetcanary.nvlinkServices" .) -}}
privileged
{{- else -}}
restricted
{{- end -}}
{{- end -}}

{{/* The exporter's config: what the features need, then .Values.config over it. */}}
{{- define "fleetcanary.config" -}}
{{- $c := dict "state_dir" "/var/lib/fleetcanary" "server" (dict "listen_address" ":9835") -}}
{{- $kube := dict "mode" "auto" "gpu_allocation_policy" "skip" -}}
{{- $probes := dict "host_memory_bandwidth" (dict "params" (dict "threads" 2)) "storage" (dict "enabled" false) "object_storage" (dict "enabled" false) "inference" (dict "enabled" false) -}}
{{- if .Values.nodeCondition.enabled -}}
{{- $_ := set $kube "node_condition" (dict "enabled" true "type" .Values.nodeCondition.type "probes" .Values.nodeCondition.probes "consecutive_failures" .Values.nodeCondition.consecutiveFailures) -}}
{{- end -}}
{{- if .Values.scheduledRuns.enabled -}}
{{- $_ := set $kube "claim" (dict "enabled" true "after_seconds" .Values.scheduledRuns.afterSeconds "image" (include "fleetcanary.image" .) "inbox_host_path" .Values.scheduledRuns.inboxHostPath "service_account" (printf "%s-claim" (include "fleetcanary.fullname" .)) "priority_class" (printf "%s-claim" (include "fleetcanary.fullname" .))) -}}
{{- end -}}
{{- if .Values.fabric.enabled -}}
{{- $sel := printf "app.kubernetes.io/name=fleetcanary,app.kubernetes.io/instance=%s" .Release.Name -}}
{{- $_ := set $probes "fabric" (dict "enabled" true "interval_seconds" 300 "timeout_seconds" 120 "params" (dict "members_from" "kubernetes" "kubernetes_namespace" .Release.Namespace "kubernetes_label_selector" $sel "port" .Values.fabric.port "slot_seconds" 300 "secret_file" "/etc/fleetcanary-fabric/secret")) -}}
{{- end -}}
{{- if .Values.cpuOnly.enabled -}}
{{- range $p := list "gpu_health" "gpu_bandwidth" "gpu_p2p" "gpu_compute" "gpu_sustained" "train_step" -}}
{{- $_ := set $probes $p (dict "enabled" false) -}}
{{- end -}}
{{- $_ := set $probes "collectives" (dict "params" (dict "backend" "gloo" "cpu_ranks" 2)) -}}
{{- else -}}
{{- $_ := set $c "gpu" (dict "budget_ratio" 0.005) -}}
{{- end -}}
{{- if include "fleetcanary.nvlinkServices" . -}}
{{- $_ := set $probes "gpu_health" (dict "params" (dict "host_proc_path" "/host/proc" "imex_nodes_config" "/host/etc/nvidia-imex/nodes_config.cfg")) -}}
{{- end -}}
{{- $_ := set $c "kubernetes" $kube -}}
{{- $_ := set $c "probes" $probes -}}
{{- toYaml (mustMergeOverwrite $c (deepCopy .Values.config)) -}}
{{- end -}}

{{/* Privileged: the GPU access modes that need it (a runtime that honours NVIDIA_VISIBLE_DEVICES only then). */}}
{{- define "fleetcanary.gpuPrivileged" -}}
{{- if has (include "fleetcanary.gpuAccess" .) (list "privileged" "gke") }}true{{ end -}}
{{- end -}}

{{/* How the GPUs are reached: gpuAccess.mode, or "none" on CPU-only nodes (no GPU, nothing to reach). */}}
{{- define "fleetcanary.gpuAccess" -}}
{{- ternary "none" .Values.gpuAccess.mode .Values.cpuOnly.enabled -}}
{{- end -}}

{{/* The host's processes and IMEX list for NVLink fabric services: asked for, on GPU nodes. */}}
{{- define "fleetcanary.nvlinkServices" -}}
{{- if and .Values.nvlinkServices.enabled (not .Values.cpuOnly.enabled) }}true{{ end -}}
{{- end -}}
