"""What a user sees of a run: a progress bar, metrics.jsonl, TensorBoard events and a final plot.

Every key of the step record goes to metrics.jsonl and TensorBoard as it is; the plot and the
progress bar show the keys `telemetry` names (PLOTTED, PROGRESS).
"""

import json
import math
import time
from pathlib import Path
from typing import Any

from kuberl.runtime.telemetry import PLOTTED, PLOTTED_VALIDATION, PLOTTED_VALIDATION_SAMPLED, PROGRESS


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
        self.history = read_history(output_dir / "metrics.jsonl", up_to_step=start_step)
        # a resumed run rewrites the lines of the steps it lost with the crash, so the file is one run
        self.metrics_file = (output_dir / "metrics.jsonl").open("w", encoding="utf-8")
        self.metrics_file.writelines(json.dumps(record) + "\n" for record in self.history)
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
        record = {"step": step + 1, "epoch": epoch, **{k: v for k, v in metrics.items() if math.isfinite(v)}}
        self.history.append(record)
        self.metrics_file.write(json.dumps(record) + "\n")
        self.metrics_file.flush()
        if self.tensorboard is not None:
            for name, value in record.items():
                if name not in ("step", "epoch"):
                    self.tensorboard.add_scalar(name, value, step + 1)
        if self.bar is not None:
            shown = {label: format(metrics.get(key, float("nan")), spec) for key, label, spec in PROGRESS}
            self.bar.set_postfix(shown, refresh=False)
            self.bar.update(1)

    def close(self) -> Path | None:
        if self.bar is not None:
            self.bar.close()
        self.metrics_file.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        if not self.history:
            return None
        return plot_history(self.history, self.output_dir / "training.png", self.max_new_tokens)


def read_history(path: Path, up_to_step: int) -> list[dict[str, Any]]:
    """The metrics lines of steps 1..up_to_step of an earlier run in the same folder."""
    if up_to_step == 0 or not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [record for record in records if record.get("step", 0) <= up_to_step]


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
        if name == "response/length_mean" and max_new_tokens is not None:
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
