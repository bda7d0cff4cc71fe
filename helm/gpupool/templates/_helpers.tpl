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

{{- /* The hub's traitlets config, keyed by configurable class and trait name, as a
       jupyterhub_config.py would set them (c.GPUPool.default_build_quota = ...): the z2jh
       overlay merges it into the hub's config as it is (gpupool.kube.chart_config), with no
       table of names between the two. Each chart value lands on one trait; projects and
       departments are the ones KAI's queues are rendered from (templates/queues.yaml). */ -}}
{{- define "gpupool.hubConfig" -}}
{{- $departments := include "gpupool.departments" . | fromJson -}}
{{- $projects := include "gpupool.projects" . | fromJson -}}
{{- $build := .Values.build -}}
{{- /* build quotas: the same keys as c.GPUPool's options, group overrides included */ -}}
{{- $gpupool := dict "gpu_sharing" .Values.sharing.backend -}}
{{- range $value, $trait := dict "quota" "default_build_quota" "fractions" "allowed_fractions" "maxPerWorkspace" "max_gpus_per_workspace" "maxWorkspaces" "max_workspaces_per_user" "groupOverrides" "group_overrides" -}}
{{- if hasKey $build $value }}{{ $_ := set $gpupool $trait (get $build $value) }}{{ end -}}
{{- end -}}
{{- /* the workspace queue is an explicit choice: the listed groups in order, else the
       projects; users in none of them: defaultProject's (it names one that exists) */ -}}
{{- $spawner := dict "kai_queue_groups" ($build.queues | default (keys $projects | sortAlpha)) "kai_default_group" (include "gpupool.defaultProject" .) -}}
{{- if hasKey .Values.sharing "fractionByMemory" }}{{ $_ := set $spawner "fraction_by_memory" .Values.sharing.fractionByMemory }}{{ end -}}
{{- $trainProjects := dict -}}
{{- range $name, $p := $projects -}}
{{- $limit := dict "limit" nil -}}
{{- if and (hasKey $p "limit") (not (kindIs "invalid" $p.limit)) (ge (float64 $p.limit) 0.0) }}{{ $_ := set $limit "limit" $p.limit }}{{ end -}}
{{- $t := dict "guarantee" $p.guarantee "weight" (hasKey $p "overQuotaWeight" | ternary $p.overQuotaWeight 1) "limit" $limit.limit "priority" (hasKey $p "priority" | ternary $p.priority 100) "department" ($p.department | default "") -}}
{{- if $p.pools }}{{ $_ := set $t "pools" $p.pools }}{{ end -}}
{{- $_ := set $trainProjects $name $t -}}
{{- end -}}
{{- $trainDepartments := dict -}}
{{- range $name, $d := $departments -}}
{{- $t := dict "guarantee" ($d.quota | default 0) "limit" nil -}}
{{- if and (hasKey $d "limit") (not (kindIs "invalid" $d.limit)) (ge (float64 $d.limit) 0.0) }}{{ $_ := set $t "limit" $d.limit }}{{ end -}}
{{- $_ := set $trainDepartments $name $t -}}
{{- end -}}
{{- $pools := dict -}}
{{- range $name, $pool := .Values.nodePools -}}
{{- $t := dict -}}
{{- range $key, $list := $pool | default dict }}{{ if $list }}{{ $_ := set $t $key $list }}{{ end }}{{ end -}}
{{- $_ := set $pools $name $t -}}
{{- end -}}
{{- /* train jobs become Jobs in the hub's namespace (with userNamespaces: their owner's),
       queued by KAI (or Kueue) under the same projects (fields of gpupool.kube.objects.JobOptions) */ -}}
{{- $jobs := .Values.jobs | default dict -}}
{{- $kai := .Values.kai | default dict -}}
{{- $jobOptions := dict "namespace" .Values.hub.namespace "queue" "{project}" "checkpoint_size" ($jobs.checkpointSize | default "10Gi") "storage_class" ($jobs.storageClass | default nil) "high_priority_class" ($jobs.highPriorityClass | default "gpupool-train-high") "kueue" (.Values.kueue.enabled | default false) "kai_namespace" ($kai.namespace | default "kai-scheduler") "kai_version" ($kai.version | default "") -}}
{{- /* a finished Job, its pods' logs and its own checkpoint claim go after this many days */ -}}
{{- if hasKey $jobs "keepFinishedDays" }}{{ $_ := set $jobOptions "ttl_after_finished_s" (mul $jobs.keepFinishedDays 86400) }}{{ end -}}
{{- /* pods that fit the cluster (gpupool.kube.pod_fit): tolerations, placement, CPU and
       memory (per project over the default), pull secrets, the restricted securityContext */ -}}
{{- $projectResources := dict -}}
{{- range $name, $p := $projects }}{{ if $p.jobResources }}{{ $_ := set $projectResources $name $p.jobResources }}{{ end }}{{ end -}}
{{- $pullSecrets := list -}}
{{- range $s := $jobs.imagePullSecrets | default list }}{{ $pullSecrets = append $pullSecrets $s.name }}{{ end -}}
{{- $_ := set $jobOptions "tolerations" ($jobs.tolerations | default list) -}}
{{- $_ := set $jobOptions "node_selector" ($jobs.nodeSelector | default dict) -}}
{{- $_ := set $jobOptions "affinity" ($jobs.affinity | default dict) -}}
{{- $_ := set $jobOptions "resources" ($jobs.resources | default dict) -}}
{{- $_ := set $jobOptions "project_resources" $projectResources -}}
{{- /* the queues' minRuntime, for the hub's forecast of KAI's reclaim (gpupool.train.kai_estimates) */ -}}
{{- $minRuntime := dict -}}
{{- range $name, $p := $projects }}{{ if $p.minRuntime }}{{ $_ := set $minRuntime $name $p.minRuntime }}{{ end }}{{ end -}}
{{- $_ := set $jobOptions "queue_min_runtime" $minRuntime -}}
{{- $_ := set $jobOptions "image_pull_secrets" $pullSecrets -}}
{{- $_ := set $jobOptions "pod_security_context" ($jobs.podSecurityContext | default dict) -}}
{{- $_ := set $jobOptions "container_security_context" ($jobs.containerSecurityContext | default dict) -}}
{{- $_ := set $jobOptions "automount_service_account_token" ($jobs.automountServiceAccountToken | default false) -}}
{{- $_ := set $gpupool "gpu_tolerations" (.Values.gpuNodes.tolerations | default list) -}}
{{- with (.Values.database | default dict).url }}{{ $_ := set $gpupool "db_url" . }}{{ end -}}
{{- if .Values.inventory.fromCluster }}{{ $_ := set $gpupool "gpu_inventory" "kubernetes" }}{{ end -}}
{{- if .Values.workspaces.containerSecurityContext }}{{ $_ := set $spawner "container_security_context" .Values.workspaces.containerSecurityContext }}{{ end -}}
{{- with .Values.workspaces.hibernateStartupDir }}{{ $_ := set $spawner "hibernate_startup_dir" . }}{{ end -}}
{{- $train := dict "runner" "kubernetes" "image" ($jobs.image | default "") "grace_s" (hasKey $jobs "graceSeconds" | ternary $jobs.graceSeconds 60) "kube_job_options" $jobOptions "projects" $trainProjects "departments" $trainDepartments "node_pools" $pools -}}
{{- /* the notebooks' and train pods' address of the gpupool API: fully qualified, so it
       resolves from user namespaces too (the short name "hub" resolves in the hub's only) */ -}}
{{- $_ := set $gpupool "api_url" (printf "http://hub.%s.svc.%s:8095/services/gpupool/" .Values.hub.namespace .Values.hub.clusterDomain) -}}
{{- /* limits as on one machine: the kept log (pod_logs.py) and the working folder's sizeLimit */ -}}
{{- if hasKey $jobs "maxLogMiB" }}{{ $_ := set $train "max_log_mib" $jobs.maxLogMiB }}{{ end -}}
{{- if hasKey $jobs "logsDir" }}{{ $_ := set $train "kube_logs_dir" $jobs.logsDir }}{{ end -}}
{{- if hasKey $jobs "logStreams" }}{{ $_ := set $train "kube_log_streams" $jobs.logStreams }}{{ end -}}
{{- if hasKey $jobs "maxFolderMiB" }}{{ $_ := set $train "max_job_folder_mib" $jobs.maxFolderMiB }}{{ end -}}
{{- /* the owner's home in the job: the claim z2jh's storage mounts at mountPath (the hub finds
       it in KubeSpawner.volume_mounts and names it as kubespawner does) */ -}}
{{- with ($jobs.home | default dict) }}
{{- $_ := set $train "home_mount" (.mount | default "off") -}}
{{- if .mountPath }}{{ $_ := set $train "home_mount_path" .mountPath }}{{ end -}}
{{- end -}}
{{- $config := dict "GPUPool" $gpupool "GPUKubeSpawner" $spawner "TrainPool" $train -}}
{{- if .Values.userNamespaces.enabled -}}
{{- /* kubespawner names and creates each user's namespace (templates/user-namespaces.yaml
       gives its hub the RBAC for any of them): its 'safe' slug of the user name is a DNS label
       for any name ("Ada.Lovelace@Uni" becomes ada-lovelace-uni---<hash>), so the namespace is
       whatever kubespawner expands, never a name of our own. The labels are set when it creates
       the namespace: the Pod Security level it enforces, and gpupool.io/user, which the hub's
       admission policy and z2jh's NetworkPolicies (helm/z2jh-values.yaml) select it by. */ -}}
{{- $un := .Values.userNamespaces -}}
{{- $labels := dict "gpupool.io/user" "{username}" "pod-security.kubernetes.io/enforce" $un.podSecurity -}}
{{- $_ := set $config "KubeSpawner" (dict "enable_user_namespaces" true "slug_scheme" "safe" "user_namespace_template" (printf "%s{username}" $un.prefix) "user_namespace_labels" $labels "hub_connect_url" (printf "http://hub.%s.svc.%s:8081" .Values.hub.namespace .Values.hub.clusterDomain)) -}}
{{- if $un.networkPolicy.enabled }}{{ $_ := set $spawner "user_namespace_network_policy" (include "gpupool.singleuserPolicySpec" . | fromYaml) }}{{ end -}}
{{- /* train Jobs go to their owner's namespace (the hub reads the template above): the hub
       makes the train pods' NetworkPolicy there before the first one */ -}}
{{- if ($jobs.networkPolicy | default dict).enabled }}{{ $_ := set $jobOptions "network_policy" (include "gpupool.trainPolicySpec" . | fromYaml) }}{{ end -}}
{{- end -}}
{{- if .Values.nodeAgent.enabled -}}
{{- /* GPU use of workspaces and train jobs: this release's agents, at their Service and port */ -}}
{{- $_ := set $config "IdleCuller" (dict "sampler" "node-agent" "sampler_arg" (printf "http://gpupool-node-agent.%s:%d/pods" .Release.Namespace (int .Values.nodeAgent.port))) -}}
{{- end -}}
{{- $config | toJson -}}
{{- end }}

{{- /* The pods of gpupool's train Jobs (gpupool.kube.objects.labels) */ -}}
{{- define "gpupool.trainPods" -}}
matchLabels:
  app.kubernetes.io/managed-by: gpupool
matchExpressions:
  - {key: gpupool.io/job-id, operator: Exists}
{{- end }}

{{- /* The NetworkPolicy spec of a user namespace's workspaces: z2jh's singleuser policy exists
       in the hub's namespace only. The same rules as z2jh's defaults, with the hub's namespace
       named: in from the proxy and hub, out to the hub (8081) and the gpupool API (8095), the
       proxy, DNS, and the internet but no private network. The chart renders it in the listed
       users' namespaces and the hub makes it in every other one at spawn (before the pod). */ -}}
{{- define "gpupool.singleuserPolicySpec" -}}
podSelector:
  matchLabels:
    component: singleuser-server
policyTypes: [Ingress, Egress]
ingress:
  - ports:
      - port: notebook-port
    from:
      - namespaceSelector:
          matchLabels:
            kubernetes.io/metadata.name: {{ .Values.hub.namespace }}
        podSelector:
          matchLabels:
            hub.jupyter.org/network-access-singleuser: "true"
egress:
  - to:
      - namespaceSelector:
          matchLabels:
            kubernetes.io/metadata.name: {{ .Values.hub.namespace }}
        podSelector:
          matchLabels:
            component: hub
    ports:
      - port: 8081
      - port: 8095
  - to:
      - namespaceSelector:
          matchLabels:
            kubernetes.io/metadata.name: {{ .Values.hub.namespace }}
        podSelector:
          matchLabels:
            component: proxy
    ports:
      - port: 8000
  - ports:
      - {port: 53, protocol: UDP}
      - {port: 53, protocol: TCP}
    to:
      - namespaceSelector:
          matchLabels:
            kubernetes.io/metadata.name: kube-system
      - ipBlock: {cidr: 10.0.0.0/8}
      - ipBlock: {cidr: 172.16.0.0/12}
      - ipBlock: {cidr: 192.168.0.0/16}
  - to:
      - ipBlock:
          cidr: 0.0.0.0/0
          except:
            - 10.0.0.0/8
            - 172.16.0.0/12
            - 192.168.0.0/16
            - {{ .Values.userNamespaces.networkPolicy.cloudMetadataIP }}/32
{{- end }}

{{- /* The spec of the train pods' NetworkPolicy (templates/train-network-policy.yaml in the hub's
       namespace; with userNamespaces the hub makes it in each owner's namespace before their
       first Job). Other train pods means those of the same namespace: a user's jobs never
       reach another user's. */ -}}
{{- define "gpupool.trainPolicySpec" -}}
{{- $np := .Values.jobs.networkPolicy | default dict -}}
podSelector:
  {{- include "gpupool.trainPods" . | nindent 2 }}
policyTypes: [Ingress, Egress]
ingress:
  - from:
      - podSelector:
          {{- include "gpupool.trainPods" . | nindent 10 }}
egress:
  - to:
      - podSelector:
          {{- include "gpupool.trainPods" . | nindent 10 }}
  - to:
      # the hub's pod in the hub's namespace: the same policy is made in user namespaces
      - namespaceSelector:
          matchLabels:
            kubernetes.io/metadata.name: {{ .Values.hub.namespace }}
        podSelector:
          matchLabels:
            component: hub
    ports:
      - {port: 8095, protocol: TCP}
  - ports:
      - {port: 53, protocol: UDP}
      - {port: 53, protocol: TCP}
    to:
      - namespaceSelector:
          matchLabels:
            kubernetes.io/metadata.name: kube-system
      - ipBlock: {cidr: 10.0.0.0/8}
      - ipBlock: {cidr: 172.16.0.0/12}
      - ipBlock: {cidr: 192.168.0.0/16}
  {{- if $np.internet }}
  - to:
      - ipBlock:
          cidr: 0.0.0.0/0
          except:
            - 10.0.0.0/8
            - 172.16.0.0/12
            - 192.168.0.0/16
            - {{ $np.cloudMetadataIP | default "169.254.169.254" }}/32
  {{- end }}
  {{- with $np.egress }}
  {{- toYaml . | nindent 0 }}
  {{- end }}
{{- end }}
