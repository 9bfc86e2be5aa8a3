{{- define "faultscope.labels" -}}
app.kubernetes.io/name: faultscope
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "faultscope.fullname" -}}
{{- if eq .Release.Name "faultscope" }}faultscope{{ else }}{{ printf "%s-faultscope" .Release.Name | trunc 63 | trimSuffix "-" }}{{ end }}
{{- end }}
