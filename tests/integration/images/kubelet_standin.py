"""FAKE kubelet: runs one container of a rendered pod spec with docker or podman, as a kubelet would run it.

There is no kubelet, node or scheduler here; this plays the part of the pod spec that decides whether an
image works in a cluster: the user the container runs as (and the kubelet's refusal of a root image when
`runAsNonRoot` is set), a read-only root filesystem, dropped capabilities, no privilege escalation, the
command and arguments, plain `value` environment entries, and the volumes: an emptyDir becomes a new empty
folder any user may write (mode 0777, as the kubelet makes it; a tmpfs with `medium: Memory`), a Secret or
ConfigMap a read-only folder of its keys as files (mode 0644), a PersistentVolumeClaim a folder of this
machine, and with `automountServiceAccountToken` the
ServiceAccount's token, CA and namespace at /var/run/secrets/kubernetes.io/serviceaccount, with the
KUBERNETES_SERVICE_HOST/PORT variables the kubelet sets. Resource limits, probes, and `valueFrom`
environment entries are not played (an entry with `valueFrom` is refused). The container shares this
machine's network: the API server and the webhook's address are this machine's.
"""

import base64
import resource
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
#: podman's rootful defaults (nofile 1048576, nproc 4194304) exceed what runc may set in some sandboxes (this
#: machine's hard limits are lower); a pod inherits the node's limits, so the container gets this machine's.
NPROC_LIMIT = 32768  # podman build's own default, which runc here accepts (higher was refused)


@dataclass
class Node:
    """What the FAKE kubelet mounts from: the claims' folders, Secrets and ConfigMaps, the API server."""

    claims: dict[str, Path] = field(default_factory=dict)
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> data (base64, as the API holds it)
    configmaps: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> data
    #: The API server the pod's ServiceAccount token is for: (host, port, token, CA certificate PEM, namespace).
    service_account: tuple[str, int, str, str, str] | None = None


class PodSpecNotPlayed(Exception):
    """The pod spec asks for something this FAKE kubelet does not play; the message names the field."""


def engine_limits() -> list[str]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], NPROC_LIMIT)
    return ["--ulimit", f"nofile={soft}:{hard}", "--ulimit", f"nproc={nproc}:{nproc}"]


def security_context(pod_spec: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    """The container's effective security context: the pod's, with the container's fields over it."""
    return {**pod_spec.get("securityContext", {}), **container.get("securityContext", {})}


def image_user(engine: str, image: str) -> str:
    done = subprocess.run(
        [engine, "image", "inspect", "--format", "{{.Config.User}}", image], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def user_options(engine: str, image: str, context: dict[str, Any]) -> list[str]:
    """--user from runAsUser/runAsGroup; runAsNonRoot refuses an image whose user is root or not numeric (the
    kubelet cannot tell a name's uid either: "container has runAsNonRoot and image has non-numeric user")."""
    uid, gid = context.get("runAsUser"), context.get("runAsGroup")
    if context.get("runAsNonRoot") and uid is None:
        user = image_user(engine, image).split(":")[0]
        if not user.isdigit() or int(user) == 0:
            raise PodSpecNotPlayed(f"runAsNonRoot is set and {image} runs as user {user or 'root'!r}")
    if uid is None:
        return []
    return ["--user", f"{uid}:{gid}" if gid is not None else str(uid)]


def hardening_options(engine: str, context: dict[str, Any]) -> list[str]:
    options = []
    if context.get("readOnlyRootFilesystem"):
        options.append("--read-only")
        if engine.endswith("podman"):  # podman would mount tmpfs on /tmp, /run and /var/tmp; Kubernetes does not
            options.append("--read-only-tmpfs=false")
    if context.get("allowPrivilegeEscalation") is False:
        options += ["--security-opt", "no-new-privileges"]
    capabilities = context.get("capabilities", {})
    options += [f"--cap-drop={cap}" for cap in capabilities.get("drop", [])]
    options += [f"--cap-add={cap}" for cap in capabilities.get("add", [])]
    return options


def env_options(container: dict[str, Any]) -> list[str]:
    options = []
    for entry in container.get("env", []):
        if "value" not in entry:
            raise PodSpecNotPlayed(f"env {entry['name']}: only `value` entries are played, not {sorted(entry)}")
        options += ["--env", f"{entry['name']}={entry['value']}"]
    return options


def write_files(folder: Path, files: dict[str, bytes]) -> Path:
    """A Secret's or ConfigMap's keys as files, readable by any user (the volume's defaultMode 0644)."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)
    for key, content in files.items():
        (folder / key).write_bytes(content)
        (folder / key).chmod(0o644)
    return folder


def empty_dir(folder: Path) -> Path:
    """A new emptyDir: an empty folder any user may write. (A tmpfs would not do: podman gives a tmpfs on a
    folder the image has, such as $HOME, that folder's mode with root as its owner.)"""
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    return folder


def volume_source(volume: dict[str, Any], node: Node, scratch: Path) -> tuple[str, str | Path]:
    """("tmpfs", size) for an emptyDir in memory, ("bind", folder) for what the node mounts from a folder."""
    name = volume["name"]
    if "emptyDir" in volume and volume["emptyDir"].get("medium") == "Memory":
        return "tmpfs", str(volume["emptyDir"].get("sizeLimit", ""))
    if "emptyDir" in volume:  # its sizeLimit is the kubelet's eviction threshold, not played here
        return "bind", empty_dir(scratch / name)
    if "secret" in volume:
        data = node.secrets[volume["secret"]["secretName"]]
        return "bind", write_files(scratch / name, {key: base64.b64decode(value) for key, value in data.items()})
    if "configMap" in volume:
        data = node.configmaps[volume["configMap"]["name"]]
        return "bind", write_files(scratch / name, {key: value.encode() for key, value in data.items()})
    if "persistentVolumeClaim" in volume:
        return "bind", node.claims[volume["persistentVolumeClaim"]["claimName"]]
    raise PodSpecNotPlayed(f"volume {name}: only emptyDir, secret, configMap and persistentVolumeClaim are played")


def tmpfs_size(limit: str) -> str:
    """A Kubernetes quantity (`64Mi`, `4Gi`) as tmpfs's size (`64m`, `4g`); empty: no limit."""
    for suffix, unit in (("Ki", "k"), ("Mi", "m"), ("Gi", "g")):
        if limit.endswith(suffix):
            return f",tmpfs-size={limit[: -len(suffix)]}{unit}"
    return f",tmpfs-size={limit}" if limit else ""


def mount_options(pod_spec: dict[str, Any], container: dict[str, Any], node: Node, scratch: Path) -> list[str]:
    volumes = {volume["name"]: volume for volume in pod_spec.get("volumes", [])}
    options = []
    for mount in container.get("volumeMounts", []):
        kind, source = volume_source(volumes[mount["name"]], node, scratch)
        target = mount["mountPath"]
        if kind == "tmpfs":
            options += ["--mount", f"type=tmpfs,destination={target},tmpfs-mode=1777{tmpfs_size(str(source))}"]
        else:
            read_only = ",ro" if mount.get("readOnly") or "secret" in volumes[mount["name"]] else ""
            options += ["--mount", f"type=bind,source={source},destination={target}{read_only}"]
    return options


def service_account_options(pod_spec: dict[str, Any], node: Node, scratch: Path) -> list[str]:
    if not pod_spec.get("automountServiceAccountToken", True) or node.service_account is None:
        return []
    host, port, token, ca, namespace = node.service_account
    files = {"token": token.encode(), "ca.crt": ca.encode(), "namespace": namespace.encode()}
    folder = write_files(scratch / "serviceaccount", files)
    return [
        "--mount",
        f"type=bind,source={folder},destination={SERVICE_ACCOUNT_MOUNT},ro",
        "--env",
        f"KUBERNETES_SERVICE_HOST={host}",
        "--env",
        f"KUBERNETES_SERVICE_PORT={port}",
    ]


def run_command(
    engine: str,
    pod_spec: dict[str, Any],
    container_name: str,
    *,
    image: str,
    node: Node,
    scratch: Path,
    name: str,
) -> list[str]:
    """`<engine> run ...` for the container `container_name` of `pod_spec`, started from `image`."""
    (container,) = [c for c in pod_spec["containers"] if c["name"] == container_name]
    context = security_context(pod_spec, container)
    command = [engine, "run", "--name", name, "--network", "host", *engine_limits()]
    command += user_options(engine, image, context) + hardening_options(engine, context)
    command += env_options(container) + mount_options(pod_spec, container, node, scratch)
    command += service_account_options(pod_spec, node, scratch)
    if container.get("command"):
        command += ["--entrypoint", container["command"][0]]
        return [*command, image, *container["command"][1:], *container.get("args", [])]
    return [*command, image, *container.get("args", [])]
