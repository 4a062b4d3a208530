"""One Ray for the whole session (starting Ray costs seconds): the runtime tests' jobs and the operator tests'
pods (test_kueue) bring their own workers into it.

The jobs a test module runs in it keep their model workers warm (runtime/workers/group.py WarmWorkers): a run
that ended well leaves its processes, torch and FSDP imported, to the module's next run of the same shape
instead of starting new ones (seconds each). `test_warm_workers.py` shows a run on reused workers is bit for
bit the run on new ones. The kept workers are stopped at the end of each module, so a module's tests find the
session's Ray as the last module left it.

The session's Ray offers every pool's custom resource (as a cluster with room for any test's pools
would), since every actor asks for its pool's (api/topology.py).
"""

import os
import sys

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="session")
def ray_session():
    import ray

    from kuberl.runtime.pools.launch import start_shared_ray

    start_shared_ray()
    from kuberl.runtime.workers.group import keep_workers_warm

    with keep_workers_warm():
        yield ray
    ray.shutdown()


@pytest.fixture(autouse=True, scope="module")
def _stop_warm_workers():
    """After each module: the model workers its runs kept warm are stopped (their CPUs back to the session)."""
    yield
    group = sys.modules.get("kuberl.runtime.workers.group")  # imported only where a module ran a job
    warm = group.warm_workers() if group is not None else None
    if warm is not None:
        warm.stop_all()


@pytest.fixture(scope="session")
def rank_pool():
    """Processes that run the FSDP2 tests' ranks, started once (runtime/rank_pool.py)."""
    from tests.integration.runtime.rank_pool import RankPool

    pool = RankPool()
    yield pool
    pool.close()
