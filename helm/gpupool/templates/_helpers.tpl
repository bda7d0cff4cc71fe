{{- define "gpupool.labels" -}}
app.kubernetes.io/name: gpupool
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- /* The departments and projects in force, as JSON. Helm merges a values file into the
       chart's defaults map by map, so a default project in values.yaml would be added to
       every install's own projects (a phantom guarantee). values.yaml has none; only when a
       release names no department and no project at all does the chart make one of each,
       both "default", so that a first install works. */ -}}
{{- define "gpupool.departments" -}}
{{- if or .Values.departments .Values.projects -}}
{{- .Values.departments | default dict | toJson -}}
{{- else -}}
{{- dict "default" (dict "quota" 4 "overQuotaWeight" 1 "limit" -1) | toJson -}}
{{- end -}}
{{- end }}

{{- define "gpupool.projects" -}}
{{- if or .Values.departments .Values.projects -}}
{{- if not .Values.projects -}}
{{- fail "departments are set but no projects: each department needs its projects (projects.<name>: {department, guarantee})" -}}
{{- end -}}
{{- .Values.projects | toJson -}}
{{- else -}}
{{- dict "default" (dict "department" "default" "guarantee" 4 "overQuotaWeight" 1 "limit" -1 "priority" 100) | toJson -}}
{{- end -}}
{{- end }}

{{- /* The project whose queue holds the workspaces of users in none of build.queues' groups:
       build.defaultProject, else the only project, else the one named "default". */ -}}
{{- define "gpupool.defaultProject" -}}
{{- $projects := include "gpupool.projects" . | fromJson -}}
{{- if .Values.build.defaultProject -}}
{{- if not (hasKey $projects .Values.build.defaultProject) -}}
{{- fail (printf "build.defaultProject %s is not in .Values.projects" .Values.build.defaultProject) -}}
{{- end -}}
{{- .Values.build.defaultProject -}}
{{- else if eq (len $projects) 1 -}}
{{- keys $projects | first -}}
{{- else if hasKey $projects "default" -}}
default
{{- else -}}
{{- fail (printf "set build.defaultProject: the project whose KAI queue holds the workspaces of users in none of build.queues' groups (one of %s)" (keys $projects | sortAlpha | join ", ")) -}}
{{- end -}}
{{- end }}

{{- /* Objects that must outlive an uninstall while something still uses them (KAI's queues:
       deleting a queue strands its running pods' PodGroups), as KAI's own chart keeps its
       default queues and shard. */ -}}
{{- define "gpupool.keep" -}}
helm.sh/resource-policy: keep
{{- end }}
