"""`kuberl run` of the demo as a user starts it, in a process of its own: what it prints and what it serves.

One short run (`run`, module-scoped) of examples/tiny-grpo.yaml with the vLLM engine, so every step
reloads weights into vLLM in place, and with `--metrics-port`. While it runs, a thread scrapes
/metrics. Its Ray keeps its session files under a folder of the test's own (RAY_TMPDIR), so the
workers' logs read here are this run's and no one else's.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from kuberl.runtime.report.metrics import read_history
from kuberl.runtime.report.telemetry import CHECKPOINT_AGE, CHECKPOINT_STEP, EXPORTS, metric_names
from tests.integration.envtest import free_port
from tests.integration.runtime.jobs import DEMO

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = 4
#: What a user must never see from the demo: vLLM's expected reload warnings, torch's scalar warning,
#: Python warnings raised by kuberl's own code.
UNWANTED = (
    "Failed to load weights",
    "Converting a tensor with requires_grad=True to a scalar",
    "FutureWarning",
    "UserWarning",
    "DeprecationWarning",
)

Sample = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass
class DemoRun:
    returncode: int
    stdout: str
    stderr: str
    output: Path
    worker_logs: dict[str, str]
    scrapes: list[Sample] = field(default_factory=list)


def parse(text: str) -> Sample:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape_until(port: int, done: threading.Event, into: list[Sample]) -> None:
    while not done.is_set():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                into.append(parse(response.read().decode()))
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass  # not serving yet, or finished
        time.sleep(0.1)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoRun]:
    folder = tmp_path_factory.mktemp("demo-cli")
    manifest = yaml.safe_load(DEMO.read_text())
    manifest["spec"]["data"]["train"] = str(DEMO.parent / manifest["spec"]["data"]["train"])
    manifest["spec"]["rollout"]["engine"] = "vllm"
    manifest["spec"]["training"]["totalSteps"] = STEPS
    manifest["spec"]["resources"]["actor"]["replicas"] = 1  # one vLLM engine to start, not two
    manifest["spec"]["checkpoint"]["intervalSteps"] = 2
    manifest["spec"]["checkpoint"]["exportHf"] = False
    spec = folder / "tiny-grpo.yaml"
    spec.write_text(yaml.safe_dump(manifest))
    # Ray's socket paths must stay under 108 bytes: a short folder, not pytest's long one.
    ray_tmp = Path(tempfile.mkdtemp(prefix="kr-"))
    port = free_port()
    scrapes: list[Sample] = []
    done = threading.Event()
    scraper = threading.Thread(target=scrape_until, args=(port, done, scrapes), daemon=True)
    scraper.start()
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp)}
    try:
        command = [sys.executable, "-m", "kuberl", "run", str(spec), "--output", str(folder / "out")]
        finished = subprocess.run(
            [*command, "--metrics-port", str(port)], capture_output=True, text=True, env=env, timeout=600
        )
        done.set()
        scraper.join(5)
        logs = {path.name: path.read_text(errors="replace") for path in ray_tmp.glob("ray/session_*/logs/worker-*")}
        yield DemoRun(finished.returncode, finished.stdout, finished.stderr, folder / "out", logs, scrapes)
    finally:
        done.set()
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_the_demo_finishes_and_prints_what_it_learned(run: DemoRun):
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"done: {STEPS} steps" in run.stdout
    assert "reward" in run.stdout and "response length" in run.stdout and "KL to reference" in run.stdout


def test_the_demo_prints_no_warning_a_user_would_have_to_act_on(run: DemoRun):
    assert run.worker_logs, "no worker logs found: the test would check nothing"
    assert any("vllm" in text.lower() for text in run.worker_logs.values()), "the run did not use vLLM"
    for where, text in {"stdout": run.stdout, "stderr": run.stderr, **run.worker_logs}.items():
        for unwanted in UNWANTED:
            lines = [line for line in text.splitlines() if unwanted in line]
            assert not lines, f"{where}: {lines[:3]}"
    assert " WARNING " not in run.stderr, run.stderr[-2000:]  # the driver's own log records


def test_metrics_scraped_during_the_run_equal_the_lines_of_metrics_jsonl(run: DemoRun):
    assert run.returncode == 0, run.stderr[-3000:]
    history = {record["step"]: record for record in read_history(run.output / "metrics.jsonl", up_to_step=STEPS)}
    identity = (("namespace", "default"), ("rljob", "tiny-grpo"))
    seen_steps = set()
    for samples in run.scrapes:
        step = samples.get(("kuberl_training_step", identity))
        if step is None:
            continue  # served before the first step finished
        seen_steps.add(int(step))
        record = history[int(step)]
        compared = 0
        for export in EXPORTS:
            labels = tuple(sorted((*identity, *export.labels)))
            if export.record_key in record:
                assert samples[(export.metric, labels)] == record[export.record_key], (step, export.record_key)
                compared += 1
        assert compared >= 10, f"step {step}: only {compared} values to compare"
        assert {name for name, _ in samples} <= metric_names()
        if (CHECKPOINT_STEP, identity) in samples:
            assert samples[(CHECKPOINT_STEP, identity)] in (2, 4)
            assert 0 <= samples[(CHECKPOINT_AGE, identity)] < 600
    assert len(seen_steps) >= 2, f"scraped steps {sorted(seen_steps)} of {STEPS}: too few to compare"
    last = run.scrapes[-1] if run.scrapes else {}
    for stage in ("rollout", "update"):
        assert last[("kuberl_stage_tokens_per_second", tuple(sorted((*identity, ("stage", stage)))))] > 0
