"""/healthz: is the operator's event loop still running?

Every watch stream, handler, timer, the leader election and the admission webhook of the operator run
in one asyncio event loop (kopf's). A handler that blocks it (a synchronous call, a CPU-bound step, a
deadlock) stops all of them while the process stays up and /metrics, served by a thread of its own,
keeps answering. So the liveness probe asks the loop itself: `LoopHeartbeat.run` stamps the time
every `interval` from inside the loop, and the HTTP server's thread (metrics.py) answers /healthz
with 503 once the stamp is older than `stall_seconds`. With the chart's probe (every 10 s, 3 failures)
the kubelet restarts a wedged operator about 30 s after the loop stalls for longer than stall_seconds.
"""

import asyncio
import time
from collections.abc import Callable


class LoopHeartbeat:
    def __init__(
        self, stall_seconds: float = 10.0, interval: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if stall_seconds <= interval:
            raise ValueError(f"the stall limit ({stall_seconds} s) must exceed the heartbeat interval ({interval} s)")
        self.stall_seconds, self.interval, self.clock = stall_seconds, interval, clock
        self.last_beat = clock()  # the start-up counts as a beat: the loop has stall_seconds to begin
        self.loop: asyncio.AbstractEventLoop | None = None

    async def run(self) -> None:
        """Beat until cancelled (a task in the loop being watched)."""
        self.loop = asyncio.get_running_loop()
        while True:
            self.last_beat = self.clock()
            await asyncio.sleep(self.interval)

    def check(self) -> tuple[bool, str]:
        """(healthy, why), for /healthz."""
        silent = self.clock() - self.last_beat
        if silent > self.stall_seconds:
            return False, f"the event loop has not run for {silent:.1f} s (limit {self.stall_seconds:g} s)"
        return True, f"the event loop ran {silent:.1f} s ago"
