{{/*
Names, labels and images shared by every template.
*/}}

{{- define "flotilla.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* <release>-flotilla, or the release name when it already says flotilla; max 50 characters so
that "-controller" / "-gateway" suffixes stay within 63. */}}
{{- define "flotilla.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "flotilla.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "flotilla.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: flotilla
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: include with (dict "ctx" $ "component" "controller"). */}}
{{- define "flotilla.selectorLabels" -}}
app.kubernetes.io/name: {{ include "flotilla.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "flotilla.componentLabels" -}}
{{ include "flotilla.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* repository:tag (tag defaults to appVersion), or repository@digest. */}}
{{- define "flotilla.image" -}}
{{- if .image.digest -}}
{{- printf "%s@%s" .image.repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" .image.repository (default .ctx.Chart.AppVersion .image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "flotilla.controller.fullname" -}}
{{- printf "%s-controller" (include "flotilla.fullname" .) -}}
{{- end -}}

{{- define "flotilla.gateway.fullname" -}}
{{- printf "%s-gateway" (include "flotilla.fullname" .) -}}
{{- end -}}

{{- define "flotilla.controller.serviceAccountName" -}}
{{- if .Values.controller.serviceAccount.create -}}
{{- default (include "flotilla.controller.fullname" .) .Values.controller.serviceAccount.name -}}
{{- else -}}
{{- required "controller.serviceAccount.name is required when controller.serviceAccount.create is false" .Values.controller.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "flotilla.gateway.serviceAccountName" -}}
{{- if .Values.gateway.serviceAccount.create -}}
{{- default (include "flotilla.gateway.fullname" .) .Values.gateway.serviceAccount.name -}}
{{- else -}}
{{- required "gateway.serviceAccount.name is required when gateway.serviceAccount.create is false" .Values.gateway.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Namespaces whose Secrets the controller may get: the configured list, else <release namespace>-members (a namespace of their own: the release namespace holds Helm's release Secrets). */}}
{{- define "flotilla.controller.secretNamespaces" -}}
{{- $nss := .Values.controller.memberSecrets.namespaces -}}
{{- if not $nss -}}{{- $nss = list (printf "%s-members" .Release.Namespace | trunc 63 | trimSuffix "-") -}}{{- end -}}
{{- toJson (uniq $nss) -}}
{{- end -}}

{{/* Default soft anti-affinity: spread a component's replicas over nodes. */}}
{{- define "flotilla.affinity" -}}
{{- if .affinity -}}
{{ toYaml .affinity }}
{{- else -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "flotilla.selectorLabels" (dict "ctx" .ctx "component" .component) | nindent 12 }}
{{- end -}}
{{- end -}}

{{/* The namespace of the gateway's API-key Secrets (apiKeys.source=secrets). */}}
{{- define "flotilla.gateway.keysNamespace" -}}
{{- default (printf "%s-api-keys" .Release.Namespace | trunc 63 | trimSuffix "-") .Values.gateway.apiKeys.namespace -}}
{{- end -}}

{{/* Value combinations the schema cannot express; fails rendering with what to change. */}}
{{- define "flotilla.gateway.validate" -}}
{{- $g := .Values.gateway -}}
{{- $k := $g.apiKeys -}}
{{- if eq $k.source "secrets" -}}
{{- if ne $g.routing.source "controlCluster" -}}
{{- fail "gateway.apiKeys.source=secrets needs gateway.routing.source=controlCluster (the gateway watches the key Secrets through the control cluster); with routing.source=file use apiKeys.source=file" -}}
{{- end -}}
{{- $ns := include "flotilla.gateway.keysNamespace" . -}}
{{- if has $ns (include "flotilla.controller.secretNamespaces" . | fromJsonArray) -}}
{{- fail (printf "gateway.apiKeys.namespace %q holds member kubeconfigs (controller.memberSecrets.namespaces; empty means <release namespace>-members): the gateway may list and watch every Secret in its keys namespace, so it must be a namespace of its own" $ns) -}}
{{- end -}}
{{- if eq $ns .Release.Namespace -}}
{{- fail (printf "gateway.apiKeys.namespace %q is the release namespace, which holds Helm's release Secrets: the gateway may list and watch every Secret in its keys namespace, so it must be a namespace of its own" $ns) -}}
{{- end -}}
{{- end -}}
{{- if and $g.upstreamSecrets (eq $g.routing.source "controlCluster") -}}
{{- fail "gateway.upstreamSecrets is for routing.source=file (the routing table's tokenFile/caFile/clientCertFile/clientKeyFile); with routing.source=controlCluster name the Secrets in each InferenceCluster's spec.endpointAuth and put them in the API-key namespace" -}}
{{- end -}}
{{- if and $k.existingSecret (ne $k.source "file") -}}
{{- fail "gateway.apiKeys.existingSecret is read only with gateway.apiKeys.source=file, and holds a keys document of SHA-256 digests (docs/gateway.md), no longer comma-separated plain-text keys: set source=file after converting it, or move the keys to labelled Secrets in gateway.apiKeys.namespace" -}}
{{- end -}}
{{- if and (eq $k.source "file") (not $k.existingSecret) -}}
{{- fail "gateway.apiKeys.source=file needs gateway.apiKeys.existingSecret: the Secret (in the release namespace) whose key gateway.apiKeys.key holds the keys document" -}}
{{- end -}}
{{- if and $g.limitsStore.url $g.limitsStore.existingSecret -}}
{{- fail "gateway.limitsStore: set url or existingSecret, not both" -}}
{{- end -}}
{{- if contains "@" $g.limitsStore.url -}}
{{- fail "gateway.limitsStore.url carries credentials, which would end up in the Deployment: put the URL in a Secret and name it in gateway.limitsStore.existingSecret" -}}
{{- end -}}
{{- if and (eq $g.routing.source "controlCluster") .Values.controller.enabled (eq $g.leaderElection.leaseName .Values.controller.leaderElection.leaseName) -}}
{{- fail "gateway.leaderElection.leaseName must differ from controller.leaderElection.leaseName: the gateway and the controller elect leaders independently" -}}
{{- end -}}
{{- end -}}
