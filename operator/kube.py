"""The operator's door to the API server: a few REST verbs over the kubernetes client's connection.

Paths are built by `names`; bodies are plain dicts. Every write that creates or changes an object
is a server-side apply under FIELD_MANAGER (force: the operator owns what it applies). Errors
come out as `ApiError` with the HTTP status, so callers need no kubernetes exception types, and a
request that got no answer at all as `ApiUnreachable` (status 0), transient like a 5xx.
"""

import json
import os
import urllib.parse
from typing import Any, Protocol

import kopf
import kubernetes
import urllib3
from kubernetes.client import Configuration

from kuberl.api.wire import request_body
from kuberl.operator.names import FIELD_MANAGER

APPLY_PATCH = "application/apply-patch+yaml"  # JSON is YAML: the client sends the dict as JSON
#: The status of an ApiError when no HTTP answer came back.
UNREACHABLE = 0


class ApiError(Exception):
    def __init__(self, status: int, reason: str, body: str = "") -> None:
        self.status, self.reason, self.body = status, reason, body
        super().__init__(f"{status} {reason}: {body[:500]}")

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def transient(self) -> bool:
        """Worth retrying as it is: the server was unreachable, overloaded or failing (not refusing the request)."""
        return self.status == UNREACHABLE or self.status == 429 or self.status >= 500

    @property
    def message(self) -> str:
        """The API server's own explanation (a Status object's message), else the body as it came."""
        try:
            status = json.loads(self.body)
        except ValueError:
            return self.body[:1000] or self.reason
        found = status.get("message") if isinstance(status, dict) else None
        return str(found) if found else self.body[:1000] or self.reason


class ApiUnreachable(ApiError):
    """No answer at all: the connection failed, was reset or timed out (urllib3's errors are not OSErrors)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(UNREACHABLE, "API server unreachable", f"{type(error).__name__}: {error}")


def load_configuration(pool_size: int = 16) -> Configuration:
    """In-cluster credentials when running in a pod, else the kubeconfig (KUBECONFIG or ~/.kube/config).

    KUBECONFIG is read now, not when the kubernetes package was imported (its own default is fixed then).
    """
    configuration = Configuration()
    try:
        kubernetes.config.load_incluster_config(  # type: ignore[no-untyped-call,unused-ignore]
            client_configuration=configuration
        )
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call,unused-ignore]
            config_file=os.environ.get("KUBECONFIG") or None, client_configuration=configuration
        )
    configuration.connection_pool_maxsize = pool_size
    return configuration


def connection_info(configuration: Configuration) -> kopf.ConnectionInfo:
    """kopf's credentials from the same configuration the operator's own client uses."""
    header = configuration.get_api_key_with_prefix("BearerToken") or configuration.get_api_key_with_prefix(
        "authorization"
    )
    scheme, _, token = (header or "").partition(" ")
    if not token:  # a bare token without a scheme
        scheme, token = "", scheme
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        username=configuration.username or None,
        password=configuration.password or None,
        scheme=scheme or None,
        token=token or None,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )


class WriteFence(Protocol):
    """What a Kube asks before each write (operator/leader.py's Leadership is the one the operator uses)."""

    def write_window(self) -> float:
        """Seconds this process may still write for; raises (leader.NotLeading) when it may not write now."""
        ...


class Kube:
    """JSON over HTTPS with the kubeconfig's credentials.

    It speaks urllib3 directly rather than through the kubernetes client's ApiClient, whose request
    API changed between client releases (36 -> 37): the operator works with any of them.

    With a `fence`, every request but a GET asks it first: a write is not sent when the fence is closed,
    and one that is sent times out when the fence closes, so a replica that lost its Lease writes nothing
    once a standby may have taken over. `user_agent` names the replica in the API server's audit log.
    """

    def __init__(
        self,
        configuration: Configuration,
        timeout: float = 30.0,
        *,
        fence: WriteFence | None = None,
        user_agent: str | None = None,
    ) -> None:
        self.configuration = configuration
        self.timeout = timeout
        self.fence = fence
        self.user_agent = user_agent
        self.pool = urllib3.PoolManager(
            maxsize=configuration.connection_pool_maxsize,
            cert_reqs="CERT_REQUIRED" if configuration.verify_ssl else "CERT_NONE",
            ca_certs=configuration.ssl_ca_cert,
            cert_file=configuration.cert_file,
            key_file=configuration.key_file,
        )

    @classmethod
    def from_environment(
        cls, pool_size: int = 16, *, fence: WriteFence | None = None, user_agent: str | None = None
    ) -> "Kube":
        return cls(load_configuration(pool_size), fence=fence, user_agent=user_agent)

    def close(self) -> None:
        self.pool.clear()

    def _auth_headers(self) -> dict[str, str]:
        headers = {}
        for setting in self.configuration.auth_settings().values():
            if setting.get("in") == "header" and setting.get("value"):
                headers[str(setting["key"])] = str(setting["value"])
        return headers

    def call(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type, **self._auth_headers()}
        if self.user_agent:
            headers["User-Agent"] = self.user_agent
        timeout = self.timeout
        if method != "GET" and self.fence is not None:
            timeout = min(timeout, self.fence.write_window())  # raises when this replica may not write
        url = self.configuration.host.rstrip("/") + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = request_body(body) if body is not None else None
        try:
            response = self.pool.request(method, url, body=data, headers=headers, timeout=timeout, retries=False)
        except (urllib3.exceptions.HTTPError, OSError) as error:  # ProtocolError, NewConnectionError, timeouts
            raise ApiUnreachable(error) from error
        text = response.data.decode("utf-8", "replace") if response.data else ""
        if not 200 <= response.status < 300:
            raise ApiError(response.status, str(response.reason), text)
        return json.loads(text) if text else None

    def get(self, path: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self.call("GET", path)
        except ApiError as error:
            if error.status == 404:
                return None
            raise
        return found

    def list(self, path: str, label_selector: str, *, consistent: bool = False) -> list[dict[str, Any]]:
        """Objects matching the selector, served from the API server's watch cache (resourceVersion=0).

        A quorum read would fetch and decode every object of the kind in the namespace from etcd on
        each call; the cache may lag by milliseconds, which deterministic names and apply make harmless.
        `consistent`: a quorum read after all, for the rare question the cache could answer wrongly.
        """
        query = [("labelSelector", label_selector)] + ([] if consistent else [("resourceVersion", "0")])
        listing = self.call("GET", path, query=query)
        items: list[dict[str, Any]] = listing.get("items") or []
        return items

    def apply(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply of `body` at `path` (an object's path, or its `/status`)."""
        applied: dict[str, Any] = self.call(
            "PATCH",
            path,
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
            body=body,
            content_type=APPLY_PATCH,
        )
        return applied

    def create(self, path: str, body: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        """Create `body`; the object as stored comes back. `dry_run`: the API server admits, defaults and prunes
        it as it would and answers with the result, and stores nothing."""
        created: dict[str, Any] = self.call("POST", path, query=[("dryRun", "All")] if dry_run else None, body=body)
        return created

    def delete(self, path: str, *, uid: str | None = None, foreground: bool = False) -> bool:
        """Delete; the garbage collector takes the dependents. False if it was gone.

        In the background the object goes at once; in the foreground it stays, marked for deletion, until
        every dependent that blocks its deletion (a RayJob's RayCluster, and that cluster's pods) is gone."""
        policy = "Foreground" if foreground else "Background"
        options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": policy}
        if uid is not None:
            options["preconditions"] = {"uid": uid}
        try:
            self.call("DELETE", path, body=options)
        except ApiError as error:
            if error.status == 404:
                return False
            raise
        return True
