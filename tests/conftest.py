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


#: `make test` runs the suite in two pytest-xdist workers (`-n 2 --dist loadgroup`), and these are the groups each
#: folder's tests run in, one worker per group, in the folder's order. The folders of a group share what a session
#: starts once (the Ray of `tests/integration/conftest.py`, the API server of `envtest.py`); each group is minutes
#: of waiting on processes that start, stop and time out, so the two run side by side, and the unit tests, in no
#: group, fill whichever worker finishes first.
XDIST_GROUPS = {
    "tests/integration/runtime/": "ray-session",
    "tests/integration/chart/": "api-server",
    "tests/integration/operator/": "api-server",
    "tests/integration/loop/": "api-server",
}


def xdist_group(nodeid: str) -> str | None:
    return next((group for folder, group in XDIST_GROUPS.items() if nodeid.startswith(folder)), None)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's, when it is installed
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """`--dist loadgroup` groups by XDIST_GROUPS, not by `xdist_group` marks: xdist 3.8 marks a test's group by
    rewriting its node id, which pytest 9.2 no longer reads, so the marks group nothing (pytest-xdist#1386)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FolderGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid) or nodeid

    return FolderGroups(config, log)


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
