"""The Pod Security Standards' `restricted` profile as a function: the checks Pod Security Admission runs.

Written from https://kubernetes.io/docs/concepts/security/pod-security-standards/ (the baseline checks,
which `restricted` includes, then the restricted ones). The envtest API server (1.20) predates the
PodSecurity admission plugin (1.22+), so the tests hold pod templates against this instead.
`violations(pod)` lists every rule a pod (metadata + spec) breaks, in the policy's words; [] passes.
"""

from typing import Any

BASELINE_CAPABILITIES = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
}
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
SELINUX_TYPES = {None, "", "container_t", "container_init_t", "container_kvm_t"}


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for key in ("initContainers", "containers", "ephemeralContainers") for c in spec.get(key) or []]


def violations(pod: dict[str, Any]) -> list[str]:
    spec, annotations = pod.get("spec") or {}, (pod.get("metadata") or {}).get("annotations") or {}
    return baseline(spec, annotations) + restricted(spec)


def baseline(spec: dict[str, Any], annotations: dict[str, str]) -> list[str]:
    found = [f"host namespaces: {key}" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]
    found += [f"hostPath volume {v['name']}" for v in spec.get("volumes") or [] if "hostPath" in v]
    pod_context = spec.get("securityContext") or {}
    found += [f"unsafe sysctl {s['name']}" for s in pod_context.get("sysctls") or [] if s["name"] not in SAFE_SYSCTLS]
    for context in [pod_context] + [c.get("securityContext") or {} for c in containers(spec)]:
        selinux = context.get("seLinuxOptions") or {}
        if selinux.get("type") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
            found.append(f"seLinuxOptions {selinux}")
        if (context.get("seccompProfile") or {}).get("type") == "Unconfined":
            found.append("seccompProfile Unconfined")
    for key, value in annotations.items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and not (
            value == "runtime/default" or value.startswith("localhost/")
        ):
            found.append(f"AppArmor {key}={value}")
    for container in containers(spec):
        name, context = container["name"], container.get("securityContext") or {}
        if context.get("privileged"):
            found.append(f"{name}: privileged")
        added = set((context.get("capabilities") or {}).get("add") or [])
        found += [f"{name}: capability {cap} added" for cap in sorted(added - BASELINE_CAPABILITIES)]
        found += [f"{name}: hostPort {p['hostPort']}" for p in container.get("ports") or [] if p.get("hostPort")]
        if context.get("procMount") not in (None, "Default"):
            found.append(f"{name}: procMount {context['procMount']}")
    return found


def restricted(spec: dict[str, Any]) -> list[str]:
    pod_context = spec.get("securityContext") or {}
    found = [
        f"volume {v['name']} of type {kind}"
        for v in spec.get("volumes") or []
        for kind in v
        if kind != "name" and kind not in RESTRICTED_VOLUMES
    ]
    pod_non_root = pod_context.get("runAsNonRoot") is True
    pod_seccomp = (pod_context.get("seccompProfile") or {}).get("type") in ("RuntimeDefault", "Localhost")
    if pod_context.get("runAsUser") == 0:
        found.append("pod: runAsUser 0")
    for container in containers(spec):
        name, context = container["name"], container.get("securityContext") or {}
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation is not false")
        non_root = context.get("runAsNonRoot")
        if non_root is False or (non_root is None and not pod_non_root):
            found.append(f"{name}: runAsNonRoot is not true")
        if context.get("runAsUser") == 0:
            found.append(f"{name}: runAsUser 0")
        seccomp = (context.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost") and not (seccomp is None and pod_seccomp):
            found.append(f"{name}: seccompProfile is not RuntimeDefault or Localhost")
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            found.append(f"{name}: capabilities do not drop ALL")
        found += [f"{name}: adds {cap}" for cap in capabilities.get("add") or [] if cap != "NET_BIND_SERVICE"]
    return found
