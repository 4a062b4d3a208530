"""A reward worker scoring with a function or an endpoint starts without torch and transformers: every worker
a reward pool adds under load would otherwise spend seconds importing them (4-5 s of a core here) before it
scores anything. A reward model imports them when the worker loads it."""

import subprocess
import sys
from pathlib import Path

HEAVY = ("torch", "transformers", "vllm")


def test_the_reward_worker_module_imports_no_model_library(tmp_path: Path):
    # a fresh interpreter (this one has torch loaded), away from the checkout (its operator/ shadows the stdlib's)
    script = f"import sys, kuberl.runtime.workers.reward_worker; print([m for m in {HEAVY!r} if m in sys.modules])"
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"
