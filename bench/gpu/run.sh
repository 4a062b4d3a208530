#!/usr/bin/env bash
# The GPU suite: kuberl's GPU path measured on one machine, one table at the end (bench/gpu/suite.py).
#   bash bench/gpu/run.sh                 # Qwen2.5-0.5B and -1.5B shapes, random weights; ~3 min on one H200 (no vLLM there)
#   bash bench/gpu/run.sh --dry-run       # the plan without a GPU (CI runs this)
#   bash bench/gpu/run.sh --smoke         # every row this machine can run, on a tiny model, on the CPU
#   bash bench/gpu/run.sh --tests         # first `pytest -m gpu` (tests/integration/runtime/test_gpu.py), then the suite;
#                                         # the last line repeats the tests' summary (a caller may keep only the tail)
#
# Time limits (seconds; each interrupts its part, and the suite still prints the rows it measured):
# KUBERL_GPU_TESTS_SECONDS (default 300) and KUBERL_GPU_SUITE_SECONDS (default 600). A lent machine's call has
# a limit of its own: fit both inside it.
#
# Nothing of kuberl needs installing: the source tree goes on PYTHONPATH as the `kuberl.*` packages. The
# machine needs torch, transformers and peft (vLLM, Ray and TRL only for their rows, each skipped with the
# reason where missing) and pydantic, which the GPU machines this project borrows lack: fetch its wheels
# here first, where PyPI is reachable, into bench/gpu/wheels/ (git-ignored, ~2 MB; the target's Python is
# 3.12 by default, PYTHON_VERSION=3.11 for another),
#   bash bench/gpu/wheels.sh
# and carry that folder along (the device tool: carry ["bench/gpu/wheels"]). They are installed into a
# scratch folder, never into the machine's Python.
# Python: $PYTHON, else .venv/bin/python when it exists (make venv), else python3.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
python="${PYTHON:-$repo/.venv/bin/python}"
[[ -x "$python" ]] || python=python3

tests=0
args=()
for arg in "$@"; do
  if [[ "$arg" == --tests ]]; then tests=1; else args+=("$arg"); fi
done

scratch="$(mktemp -d "${TMPDIR:-/tmp}/kuberl-gpu.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
# kuberl's folders as the packages setuptools' package-dir maps them to (pyproject.toml)
mkdir -p "$scratch/src/kuberl"
ln -s "$repo"/kuberl/* "$scratch/src/kuberl/"
for package in api operator runtime; do ln -s "$repo/$package" "$scratch/src/kuberl/$package"; done
pythonpath="$scratch/src"
# -P on every Python started here: run from the repository root, `python -c`/`-m` would put it first on the path,
# where the folder operator/ hides the standard library's `operator` from Python 3.12 on (the GPU machines' Python)
if ! "$python" -P -c "import pydantic" 2>/dev/null; then
  wheels="${KUBERL_GPU_WHEELS:-$here/wheels}"
  if ! compgen -G "$wheels/*.whl" >/dev/null; then
    echo "pydantic is not installed and $wheels holds no wheels: run bash bench/gpu/wheels.sh where PyPI is reachable, and bring that folder" >&2
    exit 2
  fi
  "$python" -P -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$scratch/site" "$wheels"/*.whl
  pythonpath="$pythonpath:$scratch/site"
fi
export PYTHONPATH="$pythonpath${PYTHONPATH:+:$PYTHONPATH}"
export VLLM_ENABLE_V1_MULTIPROCESSING=0 RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1

status=0
tests_said="not run (no --tests)"
if (( tests )); then
  # correctness before speed; from the repository (tests/ is a package there), with the repository last on the path
  # (-P, --import-mode=append): its kuberl/ folder holds only the package's top files, and would hide the
  # kuberl.api, .operator and .runtime that $scratch/src maps (a machine with kuberl installed finds them anyway)
  tests_status=0
  (cd "$repo" && timeout --signal=INT --kill-after=20 "${KUBERL_GPU_TESTS_SECONDS:-300}" \
    "$python" -P -m pytest -p no:cacheprovider --import-mode=append -m gpu -rfE tests/integration/runtime/test_gpu.py) \
    2>&1 | tee "$scratch/tests.log" || tests_status=$?
  # pytest's summary ("N passed, M failed in S s") and its FAILED/ERROR lines, repeated under the table
  tests_said="$(grep -E '^(FAILED|ERROR) |[0-9]+ (passed|failed|skipped|errors?|deselected).* in [0-9.]+s|no tests ran' "$scratch/tests.log" || true)"
  tests_said="${tests_said:-no summary (rc $tests_status): see the output above}"
  (( tests_status == 0 )) || status=$tests_status
fi
timeout --signal=INT --kill-after=20 "${KUBERL_GPU_SUITE_SECONDS:-600}" "$python" "$here/suite.py" "${args[@]}" || status=$?
# the last lines of the run: what a caller that keeps only the tail of the output needs
echo "GPU tests (pytest -m gpu): $tests_said"
exit "$status"
