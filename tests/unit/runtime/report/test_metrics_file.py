"""metrics.jsonl: every step's values as they were (NaN and infinities included), in strict JSON, and a
resumed run that replaces the file whole or not at all."""

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kuberl.runtime.report.metrics import RunReporter, read_history


def strict_json(line: str) -> dict:
    """json.loads that refuses NaN/Infinity literals, as jq, JavaScript and most other readers do."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(line, parse_constant=refuse)


def test_non_finite_values_are_recorded_as_such_in_strict_json(tmp_path: Path):
    reporter = RunReporter(tmp_path, total_steps=2, show_progress=False)
    reporter.log_step(0, 0, {"actor/grad_norm": 0.5, "reward/mean": 0.25})
    reporter.log_step(1, 0, {"actor/grad_norm": math.nan, "reward/mean": math.inf, "kl/mean": -math.inf})
    reporter.close()
    lines = [strict_json(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines[1] == {
        "step": 2,
        "epoch": 0,
        "actor/grad_norm": "NaN",
        "reward/mean": "Infinity",
        "kl/mean": "-Infinity",
    }
    back = read_history(tmp_path / "metrics.jsonl", up_to_step=2)[1]
    assert math.isnan(back["actor/grad_norm"]) and back["reward/mean"] == math.inf and back["kl/mean"] == -math.inf


def test_a_resume_keeps_the_steps_before_its_checkpoint_and_drops_the_rest(tmp_path: Path):
    first = RunReporter(tmp_path, total_steps=4, show_progress=False)
    for step in range(3):
        first.log_step(step, 0, {"actor/loss": float(step)})
    first.close()
    resumed = RunReporter(tmp_path, total_steps=4, start_step=2, show_progress=False)
    resumed.log_step(2, 0, {"actor/loss": 20.0})
    resumed.close()
    lines = [strict_json(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(line["step"], line["actor/loss"]) for line in lines] == [(1, 0.0), (2, 1.0), (3, 20.0)]


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE and SIGXFSZ as on Linux")
def test_a_resume_that_cannot_write_the_file_leaves_the_old_one_whole(tmp_path: Path):
    # A real write failure part-way through the rewrite: the child process may write files of at most
    # 200 bytes (RLIMIT_FSIZE; a full disk fails the same way), and the old file holds 20 lines.
    old = RunReporter(tmp_path, total_steps=20, show_progress=False)
    for step in range(20):
        old.log_step(step, 0, {"actor/loss": step / 7})
    old.close()
    before = (tmp_path / "metrics.jsonl").read_bytes()
    assert len(before) > 400
    resume = textwrap.dedent(
        f"""
        import resource, signal
        from pathlib import Path
        from kuberl.runtime.report.metrics import RunReporter
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing us
        resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))
        try:
            RunReporter(Path({str(tmp_path)!r}), total_steps=20, start_step=15, show_progress=False)
        except OSError as error:
            print("failed:", error)
        """
    )
    run = subprocess.run([sys.executable, "-c", resume], capture_output=True, text=True, timeout=120)
    assert "failed: [Errno 27] File too large" in run.stdout, run.stdout + run.stderr
    assert (tmp_path / "metrics.jsonl").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".metrics")] == []  # no temporary left
