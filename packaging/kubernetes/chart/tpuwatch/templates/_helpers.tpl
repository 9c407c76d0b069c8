{{- define "tpuwatch.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tpuwatch.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tpuwatch.labels" -}}
{{ include "tpuwatch.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* tpuwatch's config: the user's, with listen and the host mounts forced. */}}
{{- define "tpuwatch.config" -}}
{{- $forced := dict "listen" (printf "0.0.0.0:%d" (int .Values.port)) "paths" (dict "sysfs" "/host/sys" "procfs" "/host/proc" "dev" "/host/dev") -}}
{{- toYaml (mergeOverwrite (deepCopy .Values.config) $forced) -}}
{{- end -}}

{{- define "tpuwatch.serviceAccountName" -}}
{{- .Values.serviceAccount.name | default (include "tpuwatch.fullname" .) -}}
{{- end -}}
