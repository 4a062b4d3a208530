"""The GPU suite's one table: a row per measured item, its baseline from the same run, the ratio and the aim."""

from dataclasses import dataclass

OK, MISSED, SKIPPED, FAILED = "ok", "MISSED", "skipped", "FAILED"


@dataclass
class Row:
    item: str  # what was measured
    model: str  # 0.5B, 1.5B or -
    value: float | None = None  # the measured figure
    unit: str = ""
    baseline: float | None = None  # what the value is compared with, measured in the same run
    baseline_name: str = ""
    aim: str = ""  # e.g. "<= 1.5x", ">= 95%", ">= 35%"
    status: str = OK
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.value is None or not self.baseline:
            return None
        return self.value / self.baseline


def judge(row: Row) -> Row:
    """Sets `status` from the aim: "<= X" / ">= X" on the ratio (x) or the value (%); no aim: ok."""
    if row.status in (SKIPPED, FAILED) or not row.aim or row.value is None:
        return row
    op, target = row.aim.split()
    figure = row.value if target.endswith("%") else row.ratio
    limit = float(target.rstrip("x%"))
    if figure is None:
        return row
    met = figure <= limit if op == "<=" else figure >= limit
    row.status = OK if met else MISSED
    return row


def skipped(item: str, model: str, reason: str, aim: str = "") -> Row:
    return Row(item, model, aim=aim, status=SKIPPED, note=reason)


def failed(item: str, model: str, error: BaseException) -> Row:
    return Row(item, model, status=FAILED, note=f"{type(error).__name__}: {error}"[:160])


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def format_table(rows: list[Row]) -> str:
    """A Markdown table (it pastes into bench/README.md as it is)."""
    lines = [
        "| item | model | value | baseline | ratio | aim | status | note |",
        "|---|---|---:|---:|---:|---|---|---|",
    ]
    for row in rows:
        value = f"{_number(row.value)} {row.unit}".strip()
        baseline = f"{_number(row.baseline)} ({row.baseline_name})" if row.baseline is not None else "-"
        ratio = f"{row.ratio:.2f}x" if row.ratio is not None else "-"
        lines.append(
            f"| {row.item} | {row.model} | {value} | {baseline} | {ratio} | {row.aim or '-'} | {row.status} "
            f"| {row.note.replace('|', '/')} |"
        )
    return "\n".join(lines)
