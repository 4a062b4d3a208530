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
