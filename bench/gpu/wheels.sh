#!/usr/bin/env bash
# pydantic's wheels for a GPU machine that lacks pydantic (bench/gpu/run.sh installs them into a scratch folder
# there). Run here, where PyPI is reachable; carry bench/gpu/wheels along (git-ignored, ~2 MB).
#   bash bench/gpu/wheels.sh                       # for the target's Python 3.12 (the GPU machines' today)
#   PYTHON_VERSION=3.11 bash bench/gpu/wheels.sh   # for another
# The versions are those pyproject.toml resolves here (kuberl's pydantic pin), so the GPU run validates specs
# exactly as CI does.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
python="${PYTHON:-$repo/.venv/bin/python}"
[[ -x "$python" ]] || python=python3
# typing-extensions is left out: the GPU machines have it, and torch there reads theirs.
version="$("$python" -c 'from importlib.metadata import version as v
print(" ".join(f"{n}=={v(n)}" for n in ("pydantic", "pydantic-core", "annotated-types", "typing-inspection")))')"
rm -rf "$here/wheels" && mkdir -p "$here/wheels"
platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$tag")
done
# shellcheck disable=SC2086  # one requirement per word
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version "${PYTHON_VERSION:-3.12}" \
  --implementation cp "${platforms[@]}" -d "$here/wheels" $version
ls "$here/wheels"
