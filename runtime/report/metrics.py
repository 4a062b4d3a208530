"""What a user sees of a run: a progress bar, metrics.jsonl, TensorBoard events and a final plot.

Every key of the step record goes to metrics.jsonl and TensorBoard as it is; the plot and the
progress bar show the keys `telemetry` names (PLOTTED, PROGRESS).

metrics.jsonl holds one strict-JSON object per step. A value that is not a finite number (a NaN loss, an
infinite gradient norm) is recorded, never dropped: JSON has no NaN or Infinity, so it is written as the
string "NaN", "Infinity" or "-Infinity", which `float()` reads back (and `read_history` does).
"""

import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from kuberl.runtime.report.telemetry import (
    PLOTTED,
    PLOTTED_VALIDATION,
    PLOTTED_VALIDATION_SAMPLED,
    PROGRESS,
    RESPONSE_LENGTH_MEAN,
)

#: How metrics.jsonl spells the numbers JSON has no literal for.
NON_FINITE_NAMES = ("NaN", "Infinity", "-Infinity")


class RunReporter:
    """Writes one metrics line per step and shows progress; `close()` draws the plot."""

    def __init__(
        self,
        output_dir: Path,
        total_steps: int,
        start_step: int = 0,
        show_progress: bool = True,
        max_new_tokens: int | None = None,
    ) -> None:
        self.output_dir = output_dir
        self.total_steps = total_steps
        self.max_new_tokens = max_new_tokens
        path = output_dir / "metrics.jsonl"
        self.history = read_history(path, up_to_step=start_step)
        # A resumed run drops the lines of the steps it lost with the crash, so the file is one run. The
        # new file replaces the old one whole: a crash (or a full disk) while writing it leaves the old one.
        replace_file(path, "".join(metrics_line(record) for record in self.history))
        self.metrics_file = path.open("a", encoding="utf-8")
        self.started = time.monotonic()
        self.start_step = start_step
        self.tensorboard = _tensorboard_writer(output_dir / "tensorboard", purge_step=start_step + 1)
        self.bar = None
        if show_progress:
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True)

    def eta_seconds(self, step: int) -> float | None:
        done = step + 1 - self.start_step
        if done <= 0:
            return None
        return (time.monotonic() - self.started) / done * (self.total_steps - step - 1)

    def log_step(self, step: int, epoch: int, metrics: dict[str, float]) -> None:
        record = {"step": step + 1, "epoch": epoch, **metrics}
        self.history.append(record)
        self.metrics_file.write(metrics_line(record))
        self.metrics_file.flush()
        if self.tensorboard is not None:
            for name, value in record.items():
                if name not in ("step", "epoch"):
                    self.tensorboard.add_scalar(name, value, step + 1)
        if self.bar is not None:
            shown = {label: format(metrics.get(key, float("nan")), spec) for key, label, spec in PROGRESS}
            self.bar.set_postfix(shown, refresh=False)
            self.bar.update(1)

    def log_before_training(self, metrics: dict[str, float]) -> None:
        """The record of step 0, before any training step (training.validateBeforeTraining); the bar stays at 0."""
        record = {"step": 0, "epoch": 0, **metrics}
        self.history.append(record)
        self.metrics_file.write(metrics_line(record))
        self.metrics_file.flush()
        if self.tensorboard is not None:
            for name, value in metrics.items():
                self.tensorboard.add_scalar(name, value, 0)

    def close(self) -> Path | None:
        if self.bar is not None:
            self.bar.close()
        self.metrics_file.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        if not self.history:
            return None
        return plot_history(self.history, self.output_dir / "training.png", self.max_new_tokens)


def metrics_line(record: dict[str, Any]) -> str:
    """One line of metrics.jsonl: strict JSON, a non-finite number as its name.

    >>> metrics_line({"step": 3, "actor/grad_norm": float("nan"), "reward/mean": float("-inf")})
    '{"step": 3, "actor/grad_norm": "NaN", "reward/mean": "-Infinity"}\\n'
    """
    encoded = {name: _encode(value) for name, value in record.items()}
    return json.dumps(encoded, allow_nan=False) + "\n"


def _encode(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def _decode(value: Any) -> Any:
    return float(value) if isinstance(value, str) and value in NON_FINITE_NAMES else value


def read_history(path: Path, up_to_step: int) -> list[dict[str, Any]]:
    """The metrics lines of steps 1..up_to_step of an earlier run in the same folder."""
    if up_to_step == 0 or not path.exists():
        return []
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    records = [{name: _decode(value) for name, value in json.loads(line).items()} for line in lines]
    return [record for record in records if record.get("step", 0) <= up_to_step]


def replace_file(path: Path, text: str) -> None:
    """Write `text` to a temporary file beside `path`, fsync it and rename it over `path` (atomic on POSIX)."""
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def _tensorboard_writer(directory: Path, purge_step: int) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is optional in slim images
        return None
    # purge_step drops events a crashed run wrote after the checkpoint this run resumes from
    return SummaryWriter(str(directory), purge_step=purge_step if purge_step > 1 else None)


def plot_history(history: list[dict[str, Any]], path: Path, max_new_tokens: int | None = None) -> Path:
    """The PLOTTED curves over the steps (and validation's, when the run validated); the response-length
    panel marks rollout.maxNewTokens."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [record["step"] for record in history]
    validated = [record for record in history if PLOTTED_VALIDATION in record]
    panels = len(PLOTTED) + bool(validated)
    fig, axes = plt.subplots(1, panels, figsize=(4 * panels, 3.2))
    for axis, (name, title) in zip(axes, PLOTTED, strict=False):
        values = [record.get(name, math.nan) for record in history]
        axis.plot(steps, values, marker=".", linewidth=1)
        if name == RESPONSE_LENGTH_MEAN and max_new_tokens is not None:
            axis.axhline(max_new_tokens, color="grey", linestyle="--", linewidth=1)
            axis.annotate("limit", (steps[0], max_new_tokens), textcoords="offset points", xytext=(2, -10))
            axis.set_ylim(0, max_new_tokens * 1.1)
        axis.set_title(title, fontsize=10)
    if validated:
        axis = axes[-1]
        sampled = next(name for name in validated[-1] if name.startswith(PLOTTED_VALIDATION_SAMPLED))
        validated_steps = [record["step"] for record in validated]
        for name in (PLOTTED_VALIDATION, sampled):
            values = [record.get(name, math.nan) for record in validated]
            axis.plot(validated_steps, values, marker="o", label=name)
        axis.set_title("validation", fontsize=10)
        axis.legend(fontsize=8)
    for axis in axes:
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
