{{/* The chart's name, and the prefix of every object's name. */}}
{{- define "omnirt.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "omnirt.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "omnirt.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "omnirt.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "omnirt.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/name: {{ include "omnirt.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of one component: (dict "root" $ "component" "controller" "pool" "") */}}
{{- define "omnirt.selector" -}}
app.kubernetes.io/name: {{ include "omnirt.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- if .pool }}
omnirt.io/pool: {{ .pool }}
{{- end }}
{{- end }}

{{- define "omnirt.controller" -}}
{{- printf "%s-controller" (include "omnirt.fullname" .) }}
{{- end }}

{{- define "omnirt.image" -}}
{{- $registry := .root.Values.image.registry }}
{{- printf "%s%s:%s" (ternary "" (printf "%s/" $registry) (empty $registry)) .name (.tag | default .root.Values.image.tag) }}
{{- end }}

{{/* Secret names: the one given (existingSecret) or the one this chart makes. */}}
{{- define "omnirt.authSecret" -}}
{{- .Values.auth.existingSecret | default (printf "%s-auth-keys" (include "omnirt.fullname" .)) }}
{{- end }}

{{- define "omnirt.tokenSecret" -}}
{{- .Values.workerToken.existingSecret | default (printf "%s-worker-token" (include "omnirt.fullname" .)) }}
{{- end }}

{{/* The job store URL; fails when none is set (the in-memory store needs replicas: 1). */}}
{{- define "omnirt.store" -}}
{{- if .Values.redis.enabled }}
{{- printf "redis://%s-redis:6379/0" (include "omnirt.fullname" .) }}
{{- else if .Values.controller.storeSecret.name }}
{{- else if .Values.controller.store }}
{{- .Values.controller.store }}
{{- else }}
{{- fail "set controller.store to your Redis (redis://HOST:PORT/DB), controller.storeSecret, or redis.enabled=true" }}
{{- end }}
{{- end }}

{{/* Where workers dial: the worker port when the controller has one, else the gRPC port. */}}
{{- define "omnirt.workerTarget" -}}
{{- printf "%s:%v" (include "omnirt.controller" .) (.Values.controller.workerPort | default .Values.controller.grpcPort) }}
{{- end }}

{{/* --artifact-store and its settings (docs/artifacts.md), for the controller and every pool. */}}
{{- define "omnirt.artifactStoreArgs" -}}
{{- with .Values.artifactStore }}
{{- if .url }}
- --artifact-store={{ .url }}
{{- with .endpoint }}
- --artifact-store-endpoint={{ . }}
{{- end }}
{{- with .region }}
- --artifact-store-region={{ . }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* The S3 credentials, from a Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY. */}}
{{- define "omnirt.artifactStoreEnv" -}}
{{- with .Values.artifactStore }}
{{- if and .url .credentialsSecret }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ .credentialsSecret }}
      key: AWS_ACCESS_KEY_ID
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .credentialsSecret }}
      key: AWS_SECRET_ACCESS_KEY
{{- end }}
{{- end }}
{{- end }}
