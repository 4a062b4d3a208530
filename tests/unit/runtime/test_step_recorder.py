"""The driver's after-step decisions under a SIGTERM that lands mid-decision (issue #12, item 7).

`StepRecorder` decides twice after a step: whether to save, and whether to stop. If it read the
preemption flag once for each, a signal landing between the two (here: while the status is published)
would stop the run claiming the previous, older checkpoint, and lose every step since. The publisher
below sends the real SIGTERM to this process from inside `publish`, so the window is hit every time.

The worker groups are the one stand-in (`ShardWritingGroup`): a real rank writes DCP shards under the
location; this one writes the files the store checks for. Everything else is real: the PreemptionWatcher
and its signal handler, the CheckpointStore on disk, the reporter's metrics.jsonl, the health checks.
"""

import os
import signal
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from kuberl.api import parse_rljob
from kuberl.runtime.checkpoint import PreemptionWatcher
from kuberl.runtime.checkpoint.checkpointing import Checkpointing
from kuberl.runtime.checkpoint.store import DCP_METADATA
from kuberl.runtime.driver import Preempted, StepRecorder
from kuberl.runtime.health import RunHealth
from kuberl.runtime.loop.controller import StepResult
from kuberl.runtime.report.metrics import RunReporter
from kuberl.runtime.report.status_publisher import StatusPublisher
from tests.conftest import REPO

TOTAL_STEPS = 5


class ShardWritingGroup:
    """Stands in for a trainer group: `save_checkpoint` writes what a rank's DCP save leaves."""

    def call(self, method: str, location: str) -> list[None]:
        assert method == "save_checkpoint"
        shard = Path(location) / "actor"
        shard.mkdir(parents=True, exist_ok=True)
        (shard / DCP_METADATA).write_bytes(b"")
        return [None]


class SignalsWhilePublishing(StatusPublisher):
    """Sends this process SIGTERM while it publishes step `at`: between the save and the stop decisions."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.published: list[int] = []

    def publish(
        self,
        progress: Mapping[str, Any],
        metrics: Mapping[str, Any],
        last_checkpoint: Mapping[str, Any] | None,
        validation: Mapping[str, Any] | None = None,
    ) -> None:
        self.published.append(progress["step"])
        if progress["step"] == self.at:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before kill returns (main thread)


def demo_job(tmp_path: Path):
    manifest = yaml.safe_load((REPO / "examples" / "tiny-grpo.yaml").read_text())
    manifest["spec"]["checkpoint"] = {"uri": str(tmp_path / "checkpoints"), "intervalSteps": 50}
    return parse_rljob(manifest)


def test_a_sigterm_during_the_status_publish_stops_after_the_next_step_with_a_save_of_that_step(tmp_path):
    job = demo_job(tmp_path)
    checkpointing = Checkpointing(job, tmp_path)
    checkpointing.groups = SimpleNamespace(trainers=[ShardWritingGroup()])
    reporter = RunReporter(tmp_path, TOTAL_STEPS, show_progress=False)
    publisher = SignalsWhilePublishing(at=2)
    stopped: Preempted | None = None
    with PreemptionWatcher() as preemption:
        recorder = StepRecorder(
            SimpleNamespace(total_steps=TOTAL_STEPS),
            checkpointing,
            reporter,
            publisher,
            preemption,
            RunHealth.from_spec(job.spec),
            SimpleNamespace(last_failure=None),
        )
        with pytest.raises(Preempted) as raised:
            for step in range(TOTAL_STEPS):
                recorder(StepResult(step, 0, {"reward/mean": 0.5}))
        stopped = raised.value
    reporter.close()
    # The signal arrived while step 2 was published: step 2's decisions had been made without it (no save
    # at intervalSteps 50), so step 3 is the one that saves and stops, and the stop names that save.
    assert publisher.published == [1, 2, 3]
    assert stopped.step == 3
    assert stopped.checkpoint is not None and stopped.checkpoint.step == 3
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith("step-")) == ["step-000003"]
