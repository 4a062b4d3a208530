"""/healthz follows the event loop, not the process: a wedged loop fails it while /metrics still answers."""

import asyncio
import threading
import time
import urllib.error
import urllib.request

import pytest

from kuberl.operator.health import LoopHeartbeat
from kuberl.operator.metrics import OperatorMetrics
from tests.unit.operator.conftest import ManualClock

STALL_SECONDS = 0.5
WEDGE_SECONDS = 3.0


def test_a_heartbeat_older_than_the_stall_limit_is_unhealthy_and_says_how_old():
    clock = ManualClock(50.0)
    heartbeat = LoopHeartbeat(stall_seconds=10.0, clock=clock)
    clock.now = 59.0
    assert heartbeat.check() == (True, "the event loop ran 9.0 s ago")
    clock.now = 61.5
    assert heartbeat.check() == (False, "the event loop has not run for 11.5 s (limit 10 s)")


def test_a_stall_limit_within_one_beat_is_refused():
    with pytest.raises(ValueError, match="must exceed the heartbeat interval"):
        LoopHeartbeat(stall_seconds=1.0, interval=1.0)


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def wait_for_status(url: str, expected: int, timeout: float) -> float:
    """Seconds until `url` answers `expected`; fails after `timeout`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if status(url) == expected:
            return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(f"{url} did not answer {expected} within {timeout} s")


def test_healthz_fails_while_a_handler_blocks_the_event_loop_and_recovers_after():
    heartbeat = LoopHeartbeat(stall_seconds=STALL_SECONDS, interval=0.1)
    server = OperatorMetrics().serve(0, addr="127.0.0.1", health=heartbeat.check)
    port = server.server_address[1]
    loop = asyncio.new_event_loop()
    beating = loop.create_task(heartbeat.run())
    thread = threading.Thread(target=loop.run_forever, name="operator-loop", daemon=True)
    thread.start()
    healthz, metrics_url = f"http://127.0.0.1:{port}/healthz", f"http://127.0.0.1:{port}/metrics"
    try:
        wait_for_status(healthz, 200, timeout=5)
        loop.call_soon_threadsafe(time.sleep, WEDGE_SECONDS)  # a synchronous call in a handler
        failed_after = wait_for_status(healthz, 503, timeout=WEDGE_SECONDS)
        assert failed_after <= STALL_SECONDS + 0.1 + 1.0  # the limit, one beat, and the poll's own pace
        assert status(metrics_url) == 200  # what the old probe asked: it would not have noticed
        wait_for_status(healthz, 200, timeout=WEDGE_SECONDS + 5)
    finally:
        loop.call_soon_threadsafe(beating.cancel)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        server.shutdown()
        server.server_close()


def test_other_paths_are_not_found():
    server = OperatorMetrics().serve(0, addr="127.0.0.1", health=LoopHeartbeat().check)
    port = server.server_address[1]
    try:
        assert status(f"http://127.0.0.1:{port}/") == 404
        assert status(f"http://127.0.0.1:{port}/healthz") == 200
    finally:
        server.shutdown()
        server.server_close()
