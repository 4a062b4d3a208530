"""Noticing that Kubernetes wants the pod gone, so the driver can save and exit resumable.

Kubernetes sends SIGTERM, waits terminationGracePeriodSeconds, then SIGKILL. The watcher only
sets a flag; the controller reads `requested` between steps, saves a checkpoint and exits with
ExitCode.RESUMABLE (75, api/contract.py), so the restarted job picks up where this one stopped.
A second signal is left to the flag too: the save under way is the fastest way out.
"""

import logging
import signal
import threading
from types import FrameType, TracebackType
from typing import Any

log = logging.getLogger(__name__)


class PreemptionWatcher:
    """Catches SIGTERM (and SIGINT unless told otherwise) in the main thread while open.

    with PreemptionWatcher() as preemption:
        for step in ...:
            train(step)
            if preemption.requested:
                save(step); return ExitCode.RESUMABLE
    """

    def __init__(self, signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("PreemptionWatcher must be created in the main thread (Python delivers signals there)")
        self._event = threading.Event()
        self.signal_name: str | None = None
        self._previous: dict[signal.Signals, Any] = {}
        for number in signals:
            self._previous[number] = signal.signal(number, self._handle)

    def _handle(self, number: int, _frame: FrameType | None) -> None:
        self.signal_name = signal.Signals(number).name
        if not self._event.is_set():
            log.warning("%s received: saving a checkpoint after this step, then exiting", self.signal_name)
        self._event.set()

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
