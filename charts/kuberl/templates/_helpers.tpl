{{/* Names, labels and computed values shared by the templates. */}}

{{- define "kuberl.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* `<release>-<chart>`, or the release name alone when it already contains the chart name. */}}
{{- define "kuberl.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Cluster-scoped objects carry the release namespace too: two releases of the same name never collide. */}}
{{- define "kuberl.clusterName" -}}
{{- printf "%s-%s" (include "kuberl.fullname" .) .Release.Namespace | trunc 253 | trimSuffix "-" }}
{{- end }}

{{- define "kuberl.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "kuberl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "kuberl.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kuberl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "kuberl.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kuberl.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kuberl.operatorImage" -}}
{{- printf "%s:%s" .Values.operator.image.repository (default .Chart.AppVersion .Values.operator.image.tag) }}
{{- end }}

{{- define "kuberl.runtimeImage" -}}
{{- printf "%s:%s" .Values.runtime.image.repository (default .Chart.AppVersion .Values.runtime.image.tag) }}
{{- end }}

{{- define "kuberl.webhookServiceName" -}}
{{- printf "%s-webhook" (include "kuberl.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kuberl.webhookSecretName" -}}
{{- printf "%s-webhook-tls" (include "kuberl.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kuberl.metricsServiceName" -}}
{{- printf "%s-metrics" (include "kuberl.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kuberl.webhookConfigurationName" -}}
{{- default (compact (list (include "kuberl.fullname" .) .Release.Namespace "kuberl.io") | join ".") .Values.webhook.configurationName }}
{{- end }}

{{- define "kuberl.checkScope" -}}
{{- if not (has .Values.rbac.scope (list "cluster" "namespace")) }}
{{- fail (printf "rbac.scope must be `cluster` or `namespace`, not %q" (toString .Values.rbac.scope)) }}
{{- end }}
{{- end }}

{{/* More than one replica needs leader election; the leader must stop before a standby may start. */}}
{{- define "kuberl.checkReplicas" -}}
{{- $election := .Values.operator.leaderElection }}
{{- if and (gt (int .Values.operator.replicas) 1) (not $election.enabled) }}
{{- fail (printf "operator.replicas is %d but operator.leaderElection.enabled is false: every replica would reconcile every RLJob; enable leader election or set operator.replicas to 1" (int .Values.operator.replicas)) }}
{{- end }}
{{- if and $election.enabled (ge (float64 $election.renewDeadlineSeconds) (float64 $election.leaseDurationSeconds)) }}
{{- fail "operator.leaderElection.renewDeadlineSeconds must be below leaseDurationSeconds: the leader must stop reconciling before a standby may take over" }}
{{- end }}
{{- end }}

{{/* The namespaces the operator watches with rbac.scope=namespace (JSON list). */}}
{{- define "kuberl.watchNamespaces" -}}
{{- if .Values.watchNamespaces }}
{{- toJson (uniq .Values.watchNamespaces) }}
{{- else }}
{{- toJson (list .Release.Namespace) }}
{{- end }}
{{- end }}

{{/* A label map as `key=value,key=value` (sorted), the form KUBERL_KUBERAY_OPERATOR_LABELS takes. */}}
{{- define "kuberl.labelList" -}}
{{- $pairs := list }}
{{- range $key, $value := . }}
{{- $pairs = append $pairs (printf "%s=%s" $key $value) }}
{{- end }}
{{- join "," $pairs }}
{{- end }}
