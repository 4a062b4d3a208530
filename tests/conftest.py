"""Shared fixtures. Integration fixtures (Ray, the API server) live beside the tests that use them."""

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.integration.envtest import BackgroundBuild

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def minimal_manifest() -> dict:
    """The smallest valid RLJob: an actor model, a data source and a reward."""
    return {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "minimal"},
        "spec": {
            "models": {"actor": {"path": "/models/actor"}},
            "data": {"train": "/data/train.jsonl"},
            "reward": {"function": "math_exact"},
        },
    }


_envtest_build: "BackgroundBuild | None" = None


def _needs_api_server(item: pytest.Item) -> bool:
    module = getattr(item, "module", None)
    return "control_plane" in getattr(item, "fixturenames", ()) or hasattr(module, "start_control_plane")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start building the API server's binaries as soon as a session is known to need them: on a fresh
    machine the build takes minutes, and it runs beside the unit and runtime tests, which come first
    (testpaths), instead of before the first operator test."""
    global _envtest_build
    if session.config.option.collectonly:
        return
    if any(_needs_api_server(item) for item in session.items):
        from tests.integration.envtest import BackgroundBuild

        _envtest_build = BackgroundBuild()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    failure = _envtest_build.failure() if _envtest_build is not None else None
    if failure:
        terminalreporter.write_sep("=", "the API server's background build failed", yellow=True)
        terminalreporter.write_line(failure)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _envtest_build is not None:
        _envtest_build.stop()
