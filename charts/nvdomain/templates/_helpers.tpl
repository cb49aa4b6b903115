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
{{- /* Self-signed mode's certificate Secret, filled by the webhook at run time. Not the
kubernetes.io/tls <release>-webhook-tls of charts that rendered the certificate: a Secret's
type cannot change, and an empty one cannot be of that type. */ -}}
{{- define "nvdomain.certSecret" -}}{{ .Release.Name }}-webhook-certificates{{- end -}}
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
{{- /* Whole seconds, rounded up, of a Go duration made of ms, s, m and h parts (values.schema.json
allows only those), e.g. "1m30s" -> 90, "500ms" -> 1, "8760h" -> 31536000. */ -}}
{{- define "nvdomain.durationSeconds" -}}
{{- $ms := 0 -}}
{{- range regexFindAll "[0-9]+(ms|s|m|h)" . -1 -}}
{{- if hasSuffix "ms" . -}}{{- $ms = add $ms (trimSuffix "ms" . | int) -}}
{{- else if hasSuffix "s" . -}}{{- $ms = add $ms (mul (trimSuffix "s" . | int) 1000) -}}
{{- else if hasSuffix "h" . -}}{{- $ms = add $ms (mul (trimSuffix "h" . | int) 3600000) -}}
{{- else -}}{{- $ms = add $ms (mul (trimSuffix "m" . | int) 60000) -}}
{{- end -}}
{{- end -}}
{{- div (add $ms 999) 1000 -}}
{{- end -}}

{{/* imagePullSecrets for every pod spec of the chart. */}}
{{- define "nvdomain.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The node pods' RuntimeClass: node.runtimeClassName, where "auto" is nvidia with source=nvml. */}}
{{- define "nvdomain.nodeRuntimeClass" -}}
{{- $rc := .Values.node.runtimeClassName -}}
{{- if eq $rc "auto" -}}{{- if eq .Values.node.agent.source "nvml" }}nvidia{{ end -}}{{- else -}}{{ $rc }}{{- end -}}
{{- end -}}

{{/* Objects the node pods need after `helm uninstall`: Helm keeps them, and the node pods delete
them once no pod on any node requires the NRI plugin (docs/operations.md, Uninstall). */}}
{{- define "nvdomain.keepOnUninstall" -}}
{{- if .Values.uninstall.enabled -}}
helm.sh/resource-policy: keep
{{- end -}}
{{- end -}}

{{/* On the node DaemonSets: the uninstall mark, cleared. An install or upgrade over a release
that is still draining after `helm uninstall` takes the kept DaemonSets back; their pods
then restart as this release's (package lifecycle). */}}
{{- define "nvdomain.uninstallMarkCleared" -}}
{{ .Values.names.labelPrefix }}/uninstall: ""
{{- end -}}

{{/* The node pods' identity for the uninstall protocol. */}}
{{- define "nvdomain.podIdentityEnv" -}}
- name: POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
- name: POD_NAMESPACE
  valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
{{- end -}}

{{- /* The user's pod labels (podLabels) without any the chart sets: the Deployment's and
DaemonSets' selectors depend on those. Call with (dict "root" $ "extra" <map>). */ -}}
{{- define "nvdomain.extraPodLabels" -}}
{{- $own := include "nvdomain.labels" .root | fromYaml -}}
{{- $extra := omit (.extra | default dict) "app.kubernetes.io/component" -}}
{{- range $k, $_ := $own }}{{ $extra = omit $extra $k }}{{ end -}}
{{- with $extra }}{{ toYaml . }}{{ end -}}
{{- end -}}
