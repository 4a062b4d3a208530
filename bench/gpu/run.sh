#!/usr/bin/env bash
# The GPU suite: kuberl's GPU path measured on one machine, one table at the end (bench/gpu/suite.py).
#   bash bench/gpu/run.sh                 # Qwen2.5-0.5B and -1.5B shapes, random weights; <= 10 min on one H100
#   bash bench/gpu/run.sh --dry-run       # the plan without a GPU
# Uses .venv/bin/python when it exists (make venv), else python3; the environment needs kuberl with the
# runtime and vllm extras (and bench, for the TRL row).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
python="${PYTHON:-$repo/.venv/bin/python}"
[[ -x "$python" ]] || python=python3
export VLLM_ENABLE_V1_MULTIPROCESSING=0 RAY_USAGE_STATS_ENABLED=0
exec timeout --signal=INT 600 "$python" "$here/suite.py" "$@"
