{{/* Chart name, possibly overridden. */}}
{{- define "kube-mvp.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Object-name prefix; short enough for the longest suffix ("-xds-server"). */}}
{{- define "kube-mvp.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kube-mvp.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "kube-mvp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component: include "kube-mvp.selector" (list . "xds-server") */}}
{{- define "kube-mvp.selector" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ include "kube-mvp.name" $ }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "kube-mvp.xdsServer.name" -}}{{ include "kube-mvp.fullname" . }}-xds-server{{- end }}
{{- define "kube-mvp.xdsServer.memoryConfigMap" -}}{{ include "kube-mvp.xdsServer.name" . }}-memory{{- end }}
{{- define "kube-mvp.envoy.name" -}}{{ include "kube-mvp.fullname" . }}-envoy{{- end }}

{{- define "kube-mvp.xdsServer.serviceAccount" -}}
{{- default (include "kube-mvp.xdsServer.name" .) .Values.serviceAccount.name }}
{{- end }}

{{/* The certificates Secret: yours or the chart's. */}}
{{- define "kube-mvp.certificates.secret" -}}
{{- default (printf "%s-certificates" (include "kube-mvp.fullname" .)) .Values.certificates.existingSecret }}
{{- end }}

{{/* Fully qualified name of xds-server's (headless) Service, as Envoy and extproc dial it. */}}
{{- define "kube-mvp.xdsServer.host" -}}
{{ include "kube-mvp.xdsServer.name" . }}.{{ .Release.Namespace }}.svc.{{ .Values.clusterDomain }}
{{- end }}

{{/* The Envoy listener port for the mode. */}}
{{- define "kube-mvp.listenPort" -}}
{{- if eq .Values.mode "sidecar" }}{{ .Values.sidecar.listenPort }}{{ else }}{{ .Values.envoy.listenPort }}{{ end }}
{{- end }}

{{- define "kube-mvp.image" -}}
{{- $ := index . 0 }}{{ $img := index . 1 -}}
{{ $img.repository }}:{{ default $.Chart.AppVersion $img.tag }}
{{- end }}

{{/*
Certificate parts in use, as a dict part -> true, with the pairs checked. From existingSecret:
its declared parts; otherwise the parts whose PEM values are set.
*/}}
{{- define "kube-mvp.certificates.parts" -}}
{{- $c := .Values.certificates }}
{{- $parts := dict }}
{{- if $c.existingSecret }}
{{- range $c.existingSecretParts }}{{ $_ := set $parts . true }}{{ end }}
{{- else }}
{{- if or $c.servingCert $c.servingKey }}
{{- if not (and $c.servingCert $c.servingKey) }}{{ fail "certificates.servingCert and certificates.servingKey go together: give both or neither" }}{{ end }}
{{- $_ := set $parts "serving" true }}
{{- end }}
{{- if $c.clientCA }}{{ $_ := set $parts "clientCA" true }}{{ end }}
{{- if or $c.proxyClientCert $c.proxyClientKey }}
{{- if not (and $c.proxyClientCert $c.proxyClientKey) }}{{ fail "certificates.proxyClientCert and certificates.proxyClientKey go together: give both or neither" }}{{ end }}
{{- $_ := set $parts "proxyClient" true }}
{{- end }}
{{- if $c.peerCA }}{{ $_ := set $parts "peerCA" true }}{{ end }}
{{- end }}
{{- if and $parts.proxyClient (not $parts.peerCA) }}{{ fail "certificates: a proxy client certificate needs a peer CA (peerCA): the front-proxy key is as strong as cluster-admin and must only go to verified apiservers" }}{{ end }}
{{- if and $parts.clientCA (not $parts.serving) }}{{ fail "certificates: a client CA needs a serving certificate (without TLS on Envoy's listener no client certificate can be verified)" }}{{ end }}
{{- if and $parts.clientCA (not $parts.proxyClient) (not (include "kube-mvp.kubeadmFrontProxy" .)) }}{{ fail "certificates: a client CA needs the front-proxy client certificate (proxyClientCert/proxyClientKey): without it a verified client certificate's identity cannot be forwarded, and its requests would reach the apiservers as anonymous" }}{{ end }}
{{- toJson $parts }}
{{- end }}

{{/* Where Envoy reads the certificates Secret (xds-server hands it these paths). */}}
{{- define "kube-mvp.certificates.dir" -}}/etc/kube-mvp/certificates{{- end }}

{{/* "true" when sidecar Envoys present their node's own kubeadm front-proxy client pair. */}}
{{- define "kube-mvp.kubeadmFrontProxy" -}}
{{- if and (eq .Values.mode "sidecar") .Values.sidecar.kubeadmFrontProxyClient }}true{{ end }}
{{- end }}

{{/*
With sidecar.kubeadmFrontProxyClient: where the copier containers publish the node's
front-proxy-client pair (an emptyDir), and Envoy and extproc read it.
*/}}
{{- define "kube-mvp.nodePKI.dir" -}}/var/run/kube-mvp/node-pki{{- end }}

{{/*
The group that may read the node's published key: the group Envoy and extproc run with
(podSecurityContext.runAsGroup, else fsGroup, which the emptyDir gets too).
*/}}
{{- define "kube-mvp.nodePKI.group" -}}
{{- $g := default .Values.podSecurityContext.fsGroup .Values.podSecurityContext.runAsGroup }}
{{- if not $g }}{{ fail "sidecar.kubeadmFrontProxyClient needs podSecurityContext.runAsGroup or fsGroup: the group Envoy and extproc read the node's front-proxy key with" }}{{ end }}
{{- $g | int }}
{{- end }}

{{/*
The copier's command line after `extproc copy-files`, without its mode (--once, --check, or
the loop's --interval): the node's two files as the copier mounts them, and the emptyDir.
*/}}
{{- define "kube-mvp.nodePKI.copyArgs" -}}
{{- $dir := include "kube-mvp.nodePKI.dir" . -}}
{{- toJson (list "--file=/host/front-proxy-client.crt" "--file=/host/front-proxy-client.key" (printf "--to=%s" $dir)) }}
{{- end }}

{{/*
The proxy client certificate's files, as Envoy reads them: {"cert": PATH, "key": PATH}, or {}
without one. With sidecar.kubeadmFrontProxyClient the node's kubeadm pair as the copier
containers publish it in the node-pki emptyDir, else the certificates Secret's.
*/}}
{{- define "kube-mvp.proxyClient.files" -}}
{{- $parts := include "kube-mvp.certificates.parts" . | fromJson }}
{{- if include "kube-mvp.kubeadmFrontProxy" . }}
{{- $dir := include "kube-mvp.nodePKI.dir" . }}
{{- toJson (dict "cert" (printf "%s/front-proxy-client.crt" $dir) "key" (printf "%s/front-proxy-client.key" $dir)) }}
{{- else if $parts.proxyClient }}
{{- $dir := include "kube-mvp.certificates.dir" . }}
{{- toJson (dict "cert" (printf "%s/proxy-client.crt" $dir) "key" (printf "%s/proxy-client.key" $dir)) }}
{{- else }}
{{- toJson dict }}
{{- end }}
{{- end }}

{{/*
What the two copier containers (copy-node-pki, node-pki) share: the extproc image, resources,
the mounts (the node's two files read-only, the emptyDir) and the security context: root
(runAsNonRoot false for them only), every capability dropped, no privilege escalation, a
read-only root file system, and the readers' group, which the published files get.
*/}}
{{- define "kube-mvp.nodePKI.copier" -}}
image: {{ include "kube-mvp.image" (list . .Values.image.extproc) }}
imagePullPolicy: {{ .Values.image.extproc.pullPolicy }}
resources:
  {{- toYaml .Values.sidecar.kubeadmCopier.resources | nindent 2 }}
securityContext:
  runAsUser: 0
  runAsGroup: {{ include "kube-mvp.nodePKI.group" . }}
  runAsNonRoot: false
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities: {drop: [ALL]}
volumeMounts:
  - name: node-front-proxy-client-crt
    mountPath: /host/front-proxy-client.crt
    readOnly: true
  - name: node-front-proxy-client-key
    mountPath: /host/front-proxy-client.key
    readOnly: true
  - name: node-pki
    mountPath: {{ include "kube-mvp.nodePKI.dir" . }}
{{- end }}

{{/*
Whether an optional monitoring object renders: include "kube-mvp.monitoring.on" (list . value
"monitoring.coreos.com/v1/PrometheusRule") is "true" for value true, or for "auto" when the
cluster serves that API (Helm's .Capabilities: `helm template` needs --api-versions).
*/}}
{{- define "kube-mvp.monitoring.on" -}}
{{- $ := index . 0 }}{{ $v := index . 1 }}{{ $api := index . 2 -}}
{{- if eq (toString $v) "true" }}true
{{- else if and (eq (toString $v) "auto") ($.Capabilities.APIVersions.Has $api) }}true
{{- end }}
{{- end }}

{{/*
A PromQL vector selector for one metric of this release: include "kube-mvp.series" (list .
"kube_mvp_xds_nacks_total" `reason="role"`) is kube_mvp_xds_nacks_total{namespace="NS",reason="role"}
(monitoring.prometheusRule.selector instead of namespace="NS" when set).
*/}}
{{- define "kube-mvp.series" -}}
{{- $ := index . 0 }}{{ $name := index . 1 }}{{ $more := index . 2 -}}
{{- $sel := (($.Values.monitoring | default dict).prometheusRule | default dict).selector | default (printf "namespace=%q" $.Release.Namespace) -}}
{{ $name }}{{ "{" }}{{ $sel }}{{ if $more }},{{ $more }}{{ end }}{{ "}" }}
{{- end }}
