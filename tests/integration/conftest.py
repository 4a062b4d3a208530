"""One Ray for the whole session (starting Ray costs seconds): the runtime tests' jobs and the operator tests'
pods (test_kueue) bring their own workers into it.

The session's Ray offers every pool's custom resource (as a cluster with room for any test's pools
would), since every actor asks for its pool's (api/topology.py).
"""

import os

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="session")
def ray_session():
    import ray

    from kuberl.runtime.pools.launch import shared_ray_resources

    ray.init(
        num_cpus=4,
        resources=shared_ray_resources(),
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def rank_pool():
    """Processes that run the FSDP2 tests' ranks, started once (runtime/rank_pool.py)."""
    from tests.integration.runtime.rank_pool import RankPool

    pool = RankPool()
    yield pool
    pool.close()
