"""The liveness endpoint of a running operator: /healthz fails while a handler wedges kopf's event loop,
although /metrics keeps answering, and recovers, reconciling again, when the loop runs again."""

import time

import pytest

from tests.integration.operator.conftest import LOOP_STALL_SECONDS, Cluster, RunningOperator, tiny_spec, wait_for
from tests.unit.operator.test_health import status

pytestmark = pytest.mark.integration

#: Long enough for /healthz to notice (the stall limit, one beat) with room for a busy machine.
WEDGE_SECONDS = LOOP_STALL_SECONDS + 3.0


def test_healthz_fails_while_the_event_loop_is_wedged_and_recovers_after(cluster: Cluster, operator: RunningOperator):
    base = f"http://127.0.0.1:{operator.settings.metrics_port}"
    loop = operator.operator.heartbeat.loop
    assert loop is not None, "the heartbeat runs in the operator's loop"
    wait_for(lambda: status(f"{base}/healthz") == 200, what="a healthy operator")

    wedged_at = time.monotonic()
    loop.call_soon_threadsafe(time.sleep, WEDGE_SECONDS)  # what a synchronous call in an async handler does
    wait_for(lambda: status(f"{base}/healthz") == 503, timeout=WEDGE_SECONDS, what="/healthz failing")
    noticed_after = time.monotonic() - wedged_at
    assert noticed_after <= LOOP_STALL_SECONDS + 2.0  # the limit, a beat, the probe's own pace
    assert status(f"{base}/metrics") == 200  # the probe before #12 asked this, and would not have noticed

    wait_for(lambda: status(f"{base}/healthz") == 200, timeout=WEDGE_SECONDS + 10, what="/healthz recovering")
    cluster.create("after-wedge", tiny_spec())
    cluster.wait_status("after-wedge", phase="Starting")
