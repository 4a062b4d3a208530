"""Noticing that Kubernetes wants the pod gone, so the driver can save and exit resumable.

Kubernetes sends SIGTERM, waits terminationGracePeriodSeconds, then SIGKILL. The watcher only
sets a flag; the controller reads `requested` between steps, saves a checkpoint and exits with
ExitCode.RESUMABLE (75, api/contract.py), so the restarted job picks up where this one stopped.
A second signal is left to the flag too: the save under way is the fastest way out.

On Kubernetes the signal comes from Ray's job supervisor (KubeRay stops the Ray job on suspend, a spec
change or deletion), which sends SIGKILL RAY_JOB_STOP_WAIT_TIME_S later (3 s unless the RayJob sets it:
the operator puts spec.runPolicy.stopGracePeriodSeconds there). The watcher knows that window and says,
before the save, whether the save is likely to fit it; a save cut off leaves no commit marker, so the
restart resumes from the previous commit and never adopts it.

A worker pod that Kubernetes stops (an eviction, a node drain) is noticed too, though no signal reaches the
driver: its first process, runtime/podinit.py, passes SIGTERM on to `ray start --block` (KubeRay's command),
which marks its node draining, for preemption, and keeps the node's processes running
for RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S before it kills them (Ray 2.60, python/ray/_private/node.py
`_drain_node_before_shutdown`; the operator sets that window to the job's stop window, api/contract.py).
`DrainWatcher` asks the GCS after each step whether a node the run cannot lose (a trainer's, the driver's)
is draining; if so the driver saves that step and exits resumable as for SIGTERM. A node gone before the
step ends loses its ranks' shards of it: runtime/deadline.py WorkerLost.
"""

import logging
import signal
import threading
import time
from collections.abc import Mapping
from types import FrameType, TracebackType
from typing import Any

from kuberl.api.contract import RAY_STOP_WAIT_ENV

log = logging.getLogger(__name__)

#: Set by Ray's job supervisor in every driver it starts: this process runs as a Ray job.
RAY_JOB_MARKER_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
#: Ray's wait between SIGTERM and SIGKILL when RAY_JOB_STOP_WAIT_TIME_S is not set.
RAY_DEFAULT_STOP_WAIT_SECONDS = 3.0
#: How long the driver waits for the GCS's list of draining nodes before it trains on without it.
DRAINING_NODES_TIMEOUT_SECONDS = 10.0


def stop_window_seconds(environ: Mapping[str, str]) -> float | None:
    """Seconds between a stop's SIGTERM and the SIGKILL that follows it; None outside a Ray job (kuberl run)."""
    if RAY_JOB_MARKER_ENV not in environ:
        return None
    try:
        return float(environ.get(RAY_STOP_WAIT_ENV, RAY_DEFAULT_STOP_WAIT_SECONDS))
    except ValueError:
        return RAY_DEFAULT_STOP_WAIT_SECONDS  # Ray's own int() would fail the same way and use its default


def save_outlook(window: float | None, elapsed: float, save_seconds: float | None, committed: int | None) -> str | None:
    """A warning when a save started `elapsed` s after the signal is unlikely to end before SIGKILL; else None."""
    if window is None:
        return None
    left = window - elapsed
    after = f"the job resumes from step {committed}" if committed else "the job starts again from step 0"
    if save_seconds is None:
        if left > 0:
            return None  # no save timed yet: nothing honest to predict
        return f"the stop window ({window:.0f} s) is already over: this save is likely cut off, and {after}"
    if save_seconds <= left:
        return None
    return (
        f"{left:.0f} s of the {window:.0f} s stop window are left and the last save took {save_seconds:.0f} s: this "
        f"save is likely cut off by SIGKILL, and {after} (raise spec.runPolicy.stopGracePeriodSeconds)"
    )


class PreemptionWatcher:
    """Catches SIGTERM (and SIGINT unless told otherwise) in the main thread while open.

    with PreemptionWatcher() as preemption:
        for step in ...:
            train(step)
            if preemption.requested:
                save(step); return ExitCode.RESUMABLE
    """

    def __init__(
        self,
        signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT),
        window_seconds: float | None = None,
    ) -> None:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("PreemptionWatcher must be created in the main thread (Python delivers signals there)")
        self._event = threading.Event()
        self.signal_name: str | None = None
        self.window_seconds = window_seconds  # SIGTERM to SIGKILL (stop_window_seconds); None: no SIGKILL follows
        self.received_at: float | None = None  # time.monotonic() of the first signal
        self._previous: dict[signal.Signals, Any] = {}
        for number in signals:
            self._previous[number] = signal.signal(number, self._handle)

    def _handle(self, number: int, _frame: FrameType | None) -> None:
        self.signal_name = signal.Signals(number).name
        if not self._event.is_set():
            self.received_at = time.monotonic()
            window = (
                "" if self.window_seconds is None else f" (Ray kills this driver {self.window_seconds:.0f} s after it)"
            )
            log.warning("%s received%s: saving a checkpoint after this step, then exiting", self.signal_name, window)
        self._event.set()

    def warn_if_the_save_may_not_fit(self, save_seconds: float | None, committed: int | None) -> None:
        """Before the save a stop asked for: say so when it is unlikely to end inside the stop window."""
        if self.received_at is None:
            return
        warning = save_outlook(self.window_seconds, time.monotonic() - self.received_at, save_seconds, committed)
        if warning is not None:
            log.warning("%s", warning)

    @property
    def requested(self) -> bool:
        """True once a watched signal arrived."""
        return self._event.is_set()

    def close(self) -> None:
        """Put back the handlers that were installed before; safe to call twice."""
        for number, previous in self._previous.items():
            signal.signal(number, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}

    def __enter__(self) -> "PreemptionWatcher":
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


def draining_nodes() -> dict[str, int]:
    """Node id (hex) -> the time Ray will stop it (ms since the epoch, 0: none given) of every node the GCS
    lists as draining. Ray has no public call for it: its GcsClient's `get_draining_nodes`, as Ray Serve's
    controller reads it (ray 2.60, serve/_private/cluster_node_info_cache.py)."""
    import ray

    client = ray._private.worker.global_worker.gcs_client  # type: ignore[attr-defined]  # set by ray.init
    listed = client.get_draining_nodes(timeout=DRAINING_NODES_TIMEOUT_SECONDS)
    return {node if isinstance(node, str) else node.hex(): int(deadline) for node, deadline in listed.items()}


class DrainWatcher:
    """Whether Ray is draining a node the run cannot lose in the middle of a step: a pod asked to stop.

    `nodes` maps each such node's id to what of the run lives there ("actor worker 1"). Elastic pools'
    nodes are not watched: the reward and rollout pools take a lost worker's work elsewhere, and the
    autoscaler drains only idle nodes.
    """

    def __init__(self, nodes: Mapping[str, list[str]]) -> None:
        self.nodes = {node: list(what) for node, what in nodes.items()}
        self._warned = False

    def draining(self) -> str | None:
        """What of the run is on a node being drained, and how long Ray gives it; None when nothing is."""
        try:
            listed = draining_nodes()
        except Exception as error:  # noqa: BLE001 - no answer from the GCS is no reason to stop training
            if not self._warned:
                log.warning(
                    "cannot ask Ray which nodes it is draining (%s); a stopping worker pod is not noticed", error
                )
                self._warned = True
            return None
        hit = sorted((node, deadline) for node, deadline in listed.items() if node in self.nodes)
        if not hit:
            return None
        node, deadline = hit[0]
        left = f", {max(0.0, deadline / 1000 - time.time()):.0f} s before Ray stops it" if deadline else ""
        return f"the node of {', '.join(self.nodes[node])} is being drained (its pod is stopping{left})"
