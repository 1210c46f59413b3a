{{/*
Names and labels shared by every object of the release. The full name is cut to 43
characters so that it plus a suffix of up to 20 (the longest is "-namespaced") stays a
valid 63-character name.
*/}}
{{- define "fleetserve.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 43 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 43 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "fleetserve.selectorLabels" -}}
app.kubernetes.io/name: fleetserve-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "fleetserve.labels" -}}
{{ include "fleetserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: fleetserve
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The leader election's Lease, in the release's namespace. */}}
{{- define "fleetserve.leaseName" -}}
{{- default (include "fleetserve.fullname" .) .Values.leaderElection.leaseName -}}
{{- end -}}

{{- define "fleetserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "fleetserve.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
An image reference from (list VALUES TAG): VALUES is an image block {repository, tag, digest};
its digest wins over its tag, and an empty tag is TAG.
*/}}
{{- define "fleetserve.imageRef" -}}
{{- $image := index . 0 -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository (default (index . 1) $image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The operator's own image. */}}
{{- define "fleetserve.image" -}}
{{- include "fleetserve.imageRef" (list .Values.image .Chart.AppVersion) -}}
{{- end -}}

{{/* The GPU tracks' runtime image, for the services that name none. */}}
{{- define "fleetserve.runtimeImage" -}}
{{- include "fleetserve.imageRef" (list .Values.runtime.image .Chart.AppVersion) -}}
{{- end -}}

{{/*
The CPU fallback's runtime image, for the services that name none: the CPU-only build of the
same release, so by default runtime.image's repository, and its tag (or the appVersion) with
"-cpu". A digest pins one image only: it is never carried over.
*/}}
{{- define "fleetserve.runtimeCpuImage" -}}
{{- $gpu := .Values.runtime.image -}}
{{- $cpu := .Values.runtime.cpuImage -}}
{{- $image := dict "repository" (default $gpu.repository $cpu.repository) "tag" $cpu.tag "digest" $cpu.digest -}}
{{- include "fleetserve.imageRef" (list $image (printf "%s-cpu" (default .Chart.AppVersion $gpu.tag))) -}}
{{- end -}}

{{/*
The operator's RBAC rules, read from files/operator-rbac.yaml (a byte-for-byte copy of
operator/rbac/role.yaml, which the operator's e2e tier runs under) so the chart never grants
more or less than what was tested. Returns a YAML document {all, cluster, namespaced}: "all"
is role.yaml's list as it stands; rules on cluster-scoped resources (CRDs: kopf's start-up scan) go to "cluster",
the rest to "namespaced"; role.yaml's order is kept in each.
*/}}
{{- define "fleetserve.rbacRules" -}}
{{- $clusterScoped := list "customresourcedefinitions" -}}
{{- $rules := list -}}
{{- range $doc := splitList "\n---\n" (.Files.Get "files/operator-rbac.yaml") -}}
{{- $object := fromYaml $doc -}}
{{- if eq (get $object "kind") "ClusterRole" -}}
{{- $rules = $object.rules -}}
{{- end -}}
{{- end -}}
{{- if not $rules -}}
{{- fail "files/operator-rbac.yaml holds no ClusterRole with rules: run `make chart-sync`" -}}
{{- end -}}
{{- $cluster := list -}}
{{- $namespaced := list -}}
{{- range $rule := $rules -}}
{{- $isCluster := true -}}
{{- range $resource := $rule.resources -}}
{{- if not (has $resource $clusterScoped) -}}
{{- $isCluster = false -}}
{{- end -}}
{{- end -}}
{{- if $isCluster -}}
{{- $cluster = append $cluster $rule -}}
{{- else -}}
{{- $namespaced = append $namespaced $rule -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "all" $rules "cluster" $cluster "namespaced" $namespaced) -}}
{{- end -}}

{{/* Runtime pods are the operator's children: selected by the label it puts on them. */}}
{{- define "fleetserve.runtimeSelector" -}}
matchLabels:
  app.kubernetes.io/managed-by: fleetserve-operator
{{- end -}}

{{- define "fleetserve.namespaceSelector" -}}
{{- if .Values.watchNamespaces -}}
matchNames:
{{- toYaml .Values.watchNamespaces | nindent 2 }}
{{- else -}}
any: true
{{- end -}}
{{- end -}}

{{/* A namespaceSelector body matching exactly the named namespaces. */}}
{{- define "fleetserve.namespacesIn" -}}
matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: In
    values:
      {{- toYaml . | nindent 6 }}
{{- end -}}

{{/* A NetworkPolicy peer: pods with .podLabels in the namespaces .namespaces. */}}
{{- define "fleetserve.peer" -}}
namespaceSelector:
  {{- include "fleetserve.namespacesIn" .namespaces | nindent 2 }}
podSelector:
  matchLabels:
    {{- toYaml .podLabels | nindent 4 }}
{{- end -}}
