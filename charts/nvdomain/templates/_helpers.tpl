{{- define "nvdomain.name" -}}nvdomain{{- end -}}
{{- define "nvdomain.image" -}}{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}{{- end -}}
{{- define "nvdomain.labels" -}}
app.kubernetes.io/name: nvdomain
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}
{{- define "nvdomain.webhookService" -}}{{ .Release.Name }}-webhook{{- end -}}
{{- define "nvdomain.excluded" -}}
{{- $ns := list "kube-system" .Release.Namespace -}}
{{- range .Values.webhook.excludeNamespaces }}{{ $ns = append $ns . }}{{ end -}}
{{- $ns | uniq | join "," -}}
{{- end -}}
{{/* Namespaces whose containers the NRI plugin leaves as they are: node.nri.trustedNamespaces
and the release's own. */}}
{{- define "nvdomain.trustedNamespaces" -}}
{{- $ns := list -}}
{{- range .Values.node.nri.trustedNamespaces }}{{ $ns = append $ns . }}{{ end -}}
{{- $ns = append $ns .Release.Namespace -}}
{{- $ns | uniq | join "," -}}
{{- end -}}
{{/* Environment that points in-cluster clients at an explicit apiserver address. */}}
{{- define "nvdomain.apiServerEnv" -}}
{{- if .Values.apiServer.host }}
- name: KUBERNETES_SERVICE_HOST
  value: {{ .Values.apiServer.host | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ .Values.apiServer.port | quote }}
{{- end }}
{{- end -}}
{{- define "nvdomain.securityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
capabilities: {drop: [ALL]}
seccompProfile: {type: RuntimeDefault}
{{- end -}}
