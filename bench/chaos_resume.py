"""Kill the run at random moments, restart it, and check it ends where an uninterrupted run ends.

    .venv/bin/python bench/chaos_resume.py --kills 20

Each kill is a SIGKILL of the driver's whole process group (a lost pod) after a random delay, so
some land in the middle of a checkpoint write (intervalSteps 1 keeps one in flight most of the
time). After every restart the log must say which intact checkpoint it resumed from (or that
none existed yet); at the end the per-step losses and the exported model's bytes must equal an
uninterrupted run's. Prints the count of kills, of resumes, and of kills that hit a save.
"""

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def write_job(folder: Path, steps: int) -> Path:
    manifest = yaml.safe_load((REPO / "examples" / "tiny-grpo.yaml").read_text())
    spec = manifest["spec"]
    spec["data"]["train"] = str(REPO / "examples" / spec["data"]["train"])
    spec["training"]["totalSteps"] = steps
    spec["checkpoint"] = {"intervalSteps": 1, "keepLast": 2}
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


def run(job: Path, output: Path, address: str, kill_after: float | None) -> tuple[int | None, str]:
    kuberl = Path(sys.executable).parent / "kuberl"
    proc = subprocess.Popen(
        [str(kuberl), "run", str(job), "--output", str(output), "--address", address],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    if kill_after is None:
        log, _ = proc.communicate()
        return proc.returncode, log
    try:
        log, _ = proc.communicate(timeout=kill_after)
        return proc.returncode, log
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        return None, log


def fingerprint(output: Path) -> tuple[list[float], bytes]:
    lines = (output / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["actor/loss"] for line in lines], (output / "model" / "model.safetensors").read_bytes()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    from kuberl.runtime.pools.launch import start_shared_ray

    start_shared_ray()
    address = ray.get_runtime_context().gcs_address
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        job = write_job(folder, args.steps)
        started = time.monotonic()
        code, log = run(job, folder / "reference", address, None)
        assert code == 0, log
        reference_seconds = time.monotonic() - started
        expected = fingerprint(folder / "reference")
        output = folder / "chaos"
        kills = resumes = mid_save = 0
        while kills < args.kills:
            code, log = run(job, output, address, kill_after=rng.uniform(2.0, reference_seconds))
            resumed = re.search(r"resumed from the checkpoint of step (\d+)", log)
            resumes += bool(resumed)
            if code is None:
                kills += 1
                leftovers = list((output / "checkpoints").glob("*.tmp-*")) if (output / "checkpoints").exists() else []
                mid_save += bool(leftovers)
                print(
                    f"kill {kills:2d}: resumed from step {resumed.group(1) if resumed else '-'}; "
                    f"{'killed during a save' if leftovers else 'killed between saves'}"
                )
            elif code == 0:
                print("the run finished before the kill; starting over")
                for path in sorted(output.rglob("*"), reverse=True):
                    path.unlink() if path.is_file() else path.rmdir()
            else:
                print(log)
                return 1
        code, log = run(job, output, address, None)
        resumes += "resumed from the checkpoint" in log
        ok = code == 0 and fingerprint(output) == expected
    ray.shutdown()
    print(f"kills: {kills} (during a save: {mid_save}); restarts that resumed from a checkpoint: {resumes}")
    print(f"final losses and weights equal the uninterrupted run's: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
