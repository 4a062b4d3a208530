{{/*
The operator's rules, only the verbs it uses (tests/integration/chart runs the operator as this
ServiceAccount and nothing more). `kuberl.namespacedRules` holds what lives in a namespace; with
rbac.scope=cluster they go into the ClusterRole, with rbac.scope=namespace into a Role per watched
namespace. Server-side apply of an object that does not exist yet creates it, and the API server then
checks `create` as well as `patch`: hence create+patch on what the operator applies.
*/}}

{{- define "kuberl.namespacedRules" -}}
# ---- framework (kopf) ----
# The watch stream of RLJobs; patch only to remove the finalizer kuberl versions before 0.2 put on them.
- apiGroups: ["kuberl.io"]
  resources: ["rljobs"]
  verbs: ["list", "watch", "patch"]
# The watch stream of RayJobs labelled kuberl.io/job: KubeRay moving a RayJob triggers a reconcile pass.
- apiGroups: ["ray.io"]
  resources: ["rayjobs"]
  verbs: ["list", "watch"]
# Events: kopf posts handler warnings and errors; the operator posts its own on phase transitions.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# ---- application (kuberl's reconcile pass) ----
# Read the RLJob; delete it when spec.runPolicy.ttlSecondsAfterFinished is up.
- apiGroups: ["kuberl.io"]
  resources: ["rljobs"]
  verbs: ["get", "delete"]
# Write the operator's status fields (phase, conditions, restarts; server-side apply).
- apiGroups: ["kuberl.io"]
  resources: ["rljobs/status"]
  verbs: ["patch"]
# The job's RayJobs: listed by label, created (never changed: a RayJob of the name that is not the job's is
# never taken over), deleted on restart and suspend. KubeRay, not kuberl, creates the pods; kuberl never
# touches pods or services.
- apiGroups: ["ray.io"]
  resources: ["rayjobs"]
  verbs: ["list", "create", "delete"]
# The job's ConfigMaps: `<rljob>-spec`, mounted in every Ray pod, and `<rljob>-progress`, where the runtime
# reports (server-side apply creates). list/watch: the reports, selected by label kuberl.io/component=progress.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "patch"]
# Each job's own identity, ServiceAccount + Role + RoleBinding `<rljob>-runtime`: the Role lets it patch its
# `<rljob>-progress` ConfigMap and nothing else. Created once, never changed. The API server lets the operator
# grant only what it holds itself (RBAC escalation prevention); it has neither `bind` nor `escalate`.
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["create"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["create"]
# Each job's Ray token `<rljob>-ray-token`, a fresh random one, created once. Create only: the operator
# can read, list or change no Secret, its own included.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
# Each job's NetworkPolicy `<rljob>-ray`: only the job's pods and KubeRay's operator reach its Ray pods.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["create"]
{{- end }}
{{- define "kuberl.clusterRules" -}}
# ---- framework (kopf), cluster-scoped ----
# CRD discovery: kopf notices resources added after it started (e.g. KubeRay installed after kuberl).
# Without it kopf scans once at start-up and logs a warning.
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- if eq .Values.rbac.scope "namespace" }}
# Namespace discovery: kopf lists and watches namespaces when it serves some, not all of them.
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- end }}
{{- end }}
