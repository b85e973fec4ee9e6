{{/* Names and labels. */}}
{{- define "icespool.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "icespool.fullname" -}}
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

{{- define "icespool.selectorLabels" -}}
app.kubernetes.io/name: {{ include "icespool.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "icespool.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 }}
{{ include "icespool.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "icespool.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "icespool.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
A value as TOML: maps become inline tables, lists arrays, scalars JSON literals (a JSON
string, number or boolean is also a valid TOML one). Keys are quoted, so pyiceberg
property names such as "s3.endpoint" stay one key.
*/}}
{{- define "icespool.tomlValue" -}}
{{- if kindIs "map" . -}}
{ {{- $first := true -}}
{{- range $k, $v := . -}}
{{- if not $first }}, {{ end -}}{{- $first = false -}}
{{ toJson $k }} = {{ include "icespool.tomlValue" $v }}
{{- end -}} }
{{- else if kindIs "slice" . -}}
[{{- range $i, $v := . -}}{{- if $i }}, {{ end -}}{{ include "icespool.tomlValue" $v }}{{- end -}}]
{{- else -}}
{{ toJson . }}
{{- end -}}
{{- end }}

{{/* The icespool config file from .Values.config: [section] tables, [[tables]], [[kafka]]. */}}
{{- define "icespool.configToml" -}}
{{- range $section, $body := .Values.config }}
{{- if kindIs "map" $body }}
[{{ $section }}]
{{- range $k, $v := $body }}
{{ toJson $k }} = {{ include "icespool.tomlValue" $v }}
{{- end }}
{{- else if kindIs "slice" $body }}
{{- range $entry := $body }}
[[{{ $section }}]]
{{- range $k, $v := $entry }}
{{ toJson $k }} = {{ include "icespool.tomlValue" $v }}
{{- end }}
{{- end }}
{{- end }}
{{ end }}
{{- end }}
