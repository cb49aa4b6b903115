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

{{/* The names of the release's imagePullSecrets, comma-separated: the canary carries them,
and the node-scope policy admits exactly these. */}}
{{- define "nvdomain.pullSecretNames" -}}
{{- $names := list -}}
{{- range .Values.imagePullSecrets }}{{ $names = append $names .name }}{{ end -}}
{{- join "," $names -}}
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
{{- if eq $rc "auto" -}}{{- if and (eq .Values.node.agent.source "nvml") (ne (include "nvdomain.nvmlAccess" .) "host") }}nvidia{{ end -}}{{- else -}}{{ $rc }}{{- end -}}
{{- end -}}

{{/* node.nvmlAccess, checked: how the node pods ask the NVIDIA container toolkit for NVML
(values.yaml). */}}
{{- define "nvdomain.nvmlAccess" -}}
{{- $a := .Values.node.nvmlAccess | default "envvar" -}}
{{- if not (has $a (list "envvar" "volume-mounts" "host")) }}{{ fail (printf "node.nvmlAccess %q: use envvar, volume-mounts or host (docs/node-side.md, \"NVML in the node pods\")" $a) }}{{ end -}}
{{- if and (eq $a "host") (eq .Values.node.agent.source "nvml") (not .Values.node.nvmlLibrary) }}{{ fail "node.nvmlAccess=host needs node.nvmlLibrary, the host path of libnvidia-ml.so.1 (e.g. /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1)" }}{{ end -}}
{{- $a -}}
{{- end -}}

{{/* The NVML part of a node container (agent, NRI plugin) when source=nvml, as a dict of
env (list), mounts (list), args (list) and securityContext. NVIDIA_VISIBLE_DEVICES is set
only under envvar: under volume-mounts the GPUs are asked for by mount (a toolkit that ignores
the variable in unprivileged containers ignores it anyway), and under host no toolkit reads it. */}}
{{- define "nvdomain.nvmlContainer" -}}
{{- $v := .Values.node -}}
{{- $out := dict "env" list "mounts" list "args" list "privileged" false -}}
{{- if eq $v.agent.source "nvml" -}}
{{- $a := include "nvdomain.nvmlAccess" . -}}
{{- $env := list -}}
{{- range $v.nvmlEnv }}{{ if or (eq $a "envvar") (ne .name "NVIDIA_VISIBLE_DEVICES") }}{{ $env = append $env . }}{{ end }}{{ end -}}
{{- $mounts := list -}}
{{- if eq $a "volume-mounts" }}{{ $mounts = append $mounts (dict "name" "nvml-all-gpus" "mountPath" "/var/run/nvidia-container-devices/all" "readOnly" true) }}{{ end -}}
{{- $args := list -}}
{{- with $v.nvmlLibrary -}}
{{- $mounts = append $mounts (dict "name" "nvml-library" "mountPath" "/host-nvml" "readOnly" true) -}}
{{- $args = append $args (printf "--nvml-library=/host-nvml/%s" (base .)) -}}
{{- end -}}
{{- $_ := set $out "env" $env -}}
{{- $_ = set $out "mounts" $mounts -}}
{{- $_ = set $out "args" $args -}}
{{- $_ = set $out "privileged" (eq $a "host") -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* The host volumes nvdomain.nvmlContainer mounts. */}}
{{- define "nvdomain.nvmlVolumes" -}}
{{- if eq .Values.node.agent.source "nvml" -}}
{{- if eq (include "nvdomain.nvmlAccess" .) "volume-mounts" }}
# The device plugin's volume-mounts form: the toolkit reads the mount's name, not its content.
- name: nvml-all-gpus
  hostPath: {path: /dev/null, type: CharDevice}
{{- end }}
{{- with .Values.node.nvmlLibrary }}
- name: nvml-library
  hostPath: {path: {{ dir . }}, type: Directory}
{{- end }}
{{- end -}}
{{- end -}}

{{/* The securityContext of a node container (agent, NRI plugin): root, nothing writable, no
capability; privileged only under node.nvmlAccess=host, where nothing else gives the
container the GPUs' device nodes. */}}
{{- define "nvdomain.nodeSecurityContext" -}}
{{- if .privileged -}}
{runAsUser: 0, privileged: true, readOnlyRootFilesystem: true}
{{- else -}}
{runAsUser: 0, readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
{{- end -}}
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

{{/* Where containerd keeps its configuration on the nodes, as a dict: confDir (the drop-in
directory the NRI snippet goes to), config (the main config containerd reads, checked for the
imports line) and template (RKE2/k3s: the file an administrator edits, since the config is
generated from it at every start; "" elsewhere) and socket (containerd's gRPC socket, for
node.restartContainerd). node.containerdDistribution picks the paths of
RKE2 or k3s; "" keeps node.containerdConfDir and node.containerdConfig. */}}
{{- define "nvdomain.containerdPaths" -}}
{{- $d := .Values.node.containerdDistribution | default "" -}}
{{- if eq $d "" -}}
{{- toJson (dict "confDir" .Values.node.containerdConfDir "config" .Values.node.containerdConfig "template" "" "socket" ((.Values.node.restartContainerd | default dict).socket | default "/run/containerd/containerd.sock")) -}}
{{- else if has $d (list "rke2" "k3s") -}}
{{- $root := printf "/var/lib/rancher/%s/agent/etc/containerd" $d -}}
{{- toJson (dict "confDir" (printf "%s/conf.d" $root) "config" (printf "%s/config.toml" $root) "template" (printf "%s/config-v3.toml.tmpl" $root) "socket" "/run/k3s/containerd/containerd.sock") -}}
{{- else -}}
{{- fail (printf "node.containerdDistribution %q: use \"\" (containerd's own paths, node.containerdConfDir and node.containerdConfig), rke2 or k3s" $d) -}}
{{- end -}}
{{- end -}}

{{/* The host directory for the OCI hook runc runs: node.hostBinDir, or the deprecated
node.nri.hookDir where values an earlier release kept (--reuse-values) still set it. */}}
{{- define "nvdomain.hostBinDir" -}}
{{- .Values.node.nri.hookDir | default .Values.node.hostBinDir | default "/opt/nvdomain/bin" -}}
{{- end -}}

{{/*
The node pods' architecture requirement: only nodes whose kubernetes.io/arch the release image
carries (node.architectures), so a node the image cannot serve gets no pod that never starts.
*/}}
{{- define "nvdomain.nodeArchitectures" -}}
- {key: kubernetes.io/arch, operator: In, values: [{{ join ", " .Values.node.architectures }}]}
{{- end }}

{{/*
Whether DRA reservations run (non-empty for yes): DRA with its templates, dra.reservations,
and a Kubernetes with device taints on by default (1.36).
*/}}
{{- define "nvdomain.draReservations" -}}
{{- if and .Values.dra.enabled .Values.dra.templates .Values.dra.reservations (semverCompare ">=1.36.0-0" .Capabilities.KubeVersion.Version) -}}
true
{{- end -}}
{{- end }}
