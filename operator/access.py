"""Who may reach and write what, per job: pure builders of the objects that fence one RLJob in.

- The job's own identity: ServiceAccount, Role and RoleBinding `<job>-runtime`. The Role allows one
  verb on one object, `patch` on the ConfigMap `<job>-progress`, where the runtime reports progress,
  metrics and its last checkpoint. RBAC (1.20 too) enforces `resourceNames`, so a job's pods cannot
  touch a neighbour's report, nor any RLJob: the operator alone writes RLJob status, copying the
  report's fields in after validating them (decide.py). The token is mounted only in the head pod,
  where the controller publishes (builders.py).
- With an elastic pool, the autoscaler's own identity: KubeRay gives its autoscaler, a container it adds to
  the head pod, a Role over every pod and RayCluster of the namespace (pods get/list/watch/patch, pods/resize,
  rayclusters get/patch, no resourceNames: KubeRay v1.6.2 common/rbac.go `BuildRole`), bound to the head pod's
  ServiceAccount (utils.go `GetHeadGroupServiceAccountName`). The head pod then runs as a ServiceAccount of its
  own, `<job>-autoscaler`, made here (KubeRay requires one it is told to use to exist), without an automatic
  token: its token is projected into the autoscaler's container alone (builders.py), and the head's Ray
  container, where the controller, a reward without a pool and an environment's code run, gets the token of
  `<job>-runtime` instead, from the Secret `<job>-runtime-token` (type kubernetes.io/service-account-token,
  which Kubernetes' token controller fills). User code never holds the autoscaler's rights.
- The Ray token Secret `<job>-ray-token`: KubeRay's `authOptions {mode: token, secretName}` (KubeRay
  1.6+) turns Ray's token authentication on and puts the token into every Ray container and into
  its own dashboard client. The operator creates the Secret with a fresh random token at the edge
  (reconcile.py: these builders hold no secret) and never reads it back: it may `create` Secrets, no
  more.
- The NetworkPolicy `<job>-ray`: the job's pods accept connections only from the job's own pods, on
  the dashboard port from KubeRay's operator (its pods' labels in its namespace: it submits the job and polls
  its status there), and on the runtime's metrics port from anywhere (Prometheus; /metrics serves read-only
  numbers).

Each is created once and never changed (`CREATE_ONLY`): the Role and its binding do not drift, the
Secret's token is never overwritten, and an object of the same name that someone else made is never
taken over. All carry the job label and an owner reference, so deleting
the RLJob garbage-collects them.
"""

import secrets
from dataclasses import dataclass, field
from typing import Any

from kuberl.api import contract
from kuberl.operator import names
from kuberl.operator.builders import Owner, child_metadata

#: The Secret key KubeRay reads the Ray token from (its RAY_AUTH_TOKEN_SECRET_KEY).
RAY_TOKEN_KEY = "auth_token"
#: What the job says when the API server drops `authOptions` from its RayJob (reconcile.py checks a dry run).
KUBERAY_TOO_OLD = (
    "KubeRay too old for token auth: the API server drops rayClusterSpec.authOptions from the RayJob (KubeRay's "
    "RayJob CRD knows it from 1.5.1, its secretName from 1.6), so the job's Ray cluster would run without "
    "authentication; nothing was created. Upgrade KubeRay to 1.6 or later (its CRDs and its operator); the job is "
    "created at the next try after that"
)


def token_auth_kept(stored: dict[str, Any]) -> bool:
    """Whether the RayJob as the API server stores it still asks KubeRay for Ray's token authentication."""
    cluster = (stored.get("spec") or {}).get("rayClusterSpec") or {}
    return (cluster.get("authOptions") or {}).get("mode") == "token"


#: Kinds created with a plain create and never changed afterwards (so an object of that name that is not the
#: job's is never taken over either); the ConfigMaps are server-side applied once the operator knows them its own.
CREATE_ONLY = frozenset({"ServiceAccount", "Role", "RoleBinding", "Secret", "NetworkPolicy", "RayJob"})


@dataclass(frozen=True)
class KubeRayPeer:
    """Where KubeRay's operator runs: its namespace, and its pods' labels there.

    The namespace is required: a label alone is no boundary, since anyone who may create a pod in any namespace
    may give it KubeRay's labels, and the job's NetworkPolicy would let that pod reach the Ray dashboard."""

    namespace: str
    labels: dict[str, str] = field(default_factory=lambda: {"app.kubernetes.io/name": "kuberay-operator"})

    def __post_init__(self) -> None:
        if not self.namespace:
            raise ValueError("KubeRay's namespace must be given: the NetworkPolicy admits its pods from there only")


def build_autoscaler_identity(owner: Owner) -> list[dict[str, Any]]:
    """ServiceAccount `<job>-autoscaler` (KubeRay binds its autoscaler's Role to it), and the Secret that carries a
    token of `<job>-runtime` into the head's Ray container, which does not get the pod's own token."""
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": child_metadata(owner, names.autoscaler_account_name(owner.name)),
        "automountServiceAccountToken": False,  # projected into the autoscaler's container only (builders.py)
    }
    runtime_token = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/service-account-token",  # Kubernetes' token controller fills it in
        "metadata": child_metadata(
            owner,
            names.runtime_token_secret_name(owner.name),
            annotations={"kubernetes.io/service-account.name": names.runtime_account_name(owner.name)},
        ),
    }
    return [account, runtime_token]


def build_runtime_identity(owner: Owner) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding `<job>-runtime`: patch the job's own report, and nothing else."""
    name = names.runtime_account_name(owner.name)
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": child_metadata(owner, name),
        "automountServiceAccountToken": False,  # the head pod asks for it; no other pod gets it
    }
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": child_metadata(owner, name),
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": [names.progress_configmap_name(owner.name)],
                "verbs": ["patch"],
            }
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": child_metadata(owner, name),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner.namespace}],
    }
    return [account, role, binding]


def build_progress_configmap(owner: Owner) -> dict[str, Any]:
    """`<job>-progress`, empty: the runtime fills `data` (field manager kuberl-runtime); the operator reads it."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child_metadata(
            owner, names.progress_configmap_name(owner.name), labels={names.COMPONENT_LABEL: names.PROGRESS_COMPONENT}
        ),
    }


def build_ray_token_secret(owner: Owner) -> dict[str, Any]:
    """`<job>-ray-token` without its token: reconcile.py adds a fresh one when it creates the Secret."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": child_metadata(owner, names.ray_token_secret_name(owner.name)),
    }


def new_ray_token() -> str:
    """A fresh token for one Ray cluster: 32 random bytes, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(32)


def is_ray_token_secret(child: dict[str, Any]) -> bool:
    """Whether `child` is the Secret `build_ray_token_secret` makes, which gets a fresh token when it is created
    (not `<job>-runtime-token`, which Kubernetes fills)."""
    meta = child["metadata"]
    return bool(
        child["kind"] == "Secret" and meta["name"] == names.ray_token_secret_name(meta["labels"][names.JOB_LABEL])
    )


def with_new_token(secret: dict[str, Any]) -> dict[str, Any]:
    """`build_ray_token_secret`'s Secret with a fresh token, as it is created (never re-read or rewritten)."""
    return {**secret, "stringData": {RAY_TOKEN_KEY: new_ray_token()}}


def build_network_policy(owner: Owner, kuberay: KubeRayPeer) -> dict[str, Any]:
    """Ingress to the job's pods from the job's pods, from KubeRay's operator to the dashboard only, and from any
    scraper to the metrics port (only the head listens there)."""
    own_pods = {"podSelector": {"matchLabels": {names.JOB_LABEL: owner.name}}}
    kuberay_operator = {
        # the label Kubernetes sets on every namespace (1.21+): a namespace cannot take another's name
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": kuberay.namespace}},
        "podSelector": {"matchLabels": dict(kuberay.labels)},
    }
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": child_metadata(owner, names.network_policy_name(owner.name)),
        "spec": {
            "podSelector": {"matchLabels": {names.JOB_LABEL: owner.name}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [own_pods]},
                {"from": [kuberay_operator], "ports": [{"protocol": "TCP", "port": contract.RAY_DASHBOARD_PORT}]},
                {"ports": [{"protocol": "TCP", "port": contract.METRICS_PORT}]},
            ],
        },
    }


def build_access(owner: Owner, kuberay: KubeRayPeer, *, autoscaled: bool = False) -> list[dict[str, Any]]:
    """Everything above, in the order to create it: nothing a pod needs is missing when KubeRay makes the pods.
    `autoscaled`: a pool is elastic, so KubeRay's autoscaler runs in the head pod with an account of its own."""
    return [
        *build_runtime_identity(owner),
        *(build_autoscaler_identity(owner) if autoscaled else []),
        build_ray_token_secret(owner),
        build_network_policy(owner, kuberay),
        build_progress_configmap(owner),
    ]
