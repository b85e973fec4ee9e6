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

{{/*
The Prometheus job of this release's scrape targets. The ServiceMonitor relabels `job` to
it (without that it would be the Service's name) and the PrometheusRule's alerts select
it, so both always agree, whatever the release is called.
*/}}
{{- define "icespool.metricsJob" -}}
{{- include "icespool.fullname" . }}
{{- end }}

{{/*
Refuse replicaCount > 1 without a shared catalog: every replica has its own volume, so a
SQLite catalog or a file:// warehouse there would give each pod its own private tables.
A catalog URI or warehouse set from a Secret (ICESPOOL__CATALOG__URI / __WAREHOUSE under
`secrets`) replaces the one in `config`, so it is judged as shared.
*/}}
{{- define "icespool.checkSharedCatalog" -}}
{{- if gt (int .Values.replicaCount) 1 }}
{{- $fromSecret := dict }}
{{- range $part := list "catalog" "objectStore" "kafka" }}
{{- $secret := index $.Values.secrets $part }}
{{- if $secret.existingSecret }}
{{- range $name, $key := $secret.env }}
{{- /* The daemon reads only ICESPOOL__ variables and lowercases the parts after it. */}}
{{- if hasPrefix "ICESPOOL__" $name }}
{{- $_ := set $fromSecret (upper $name) true }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- $catalog := .Values.config.catalog | default dict }}
{{- /* pyiceberg takes the catalog type in any case, SQLAlchemy the URI scheme too. */}}
{{- $type := lower (toString ($catalog.type | default "sql")) }}
{{- $uri := toString ($catalog.uri | default "") }}
{{- $warehouse := toString ($catalog.warehouse | default "") }}
{{- if and (eq $type "sql") (hasPrefix "sqlite" (lower $uri)) (not (hasKey $fromSecret "ICESPOOL__CATALOG__URI")) }}
{{- fail (printf "replicaCount=%d needs a catalog that all replicas share, but config.catalog.uri is SQLite (%s) on each replica's own volume: every pod would keep its own tables. Set config.catalog.type=rest with the REST catalog's uri, or config.catalog.uri to a postgresql+psycopg2:// URI (or ICESPOOL__CATALOG__URI from secrets.catalog), or set replicaCount=1." (int .Values.replicaCount) $uri) }}
{{- end }}
{{- if and (or (hasPrefix "file:" (lower $warehouse)) (hasPrefix "/" $warehouse)) (not (hasKey $fromSecret "ICESPOOL__CATALOG__WAREHOUSE")) }}
{{- fail (printf "replicaCount=%d needs a warehouse that all replicas share, but config.catalog.warehouse is %s, a path on each replica's own volume. Set config.catalog.warehouse to object storage (s3://bucket/path, gs://..., abfss://...) or set replicaCount=1." (int .Values.replicaCount) $warehouse) }}
{{- end }}
{{- end }}
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
