"""Print what `pip install "kuberl[EXTRA]"` would install directly, read from pyproject.toml, leaving out
what the base image must provide.

    python requirements.py pyproject.toml runtime --exclude torch

The images install these in a layer of their own before kuberl's wheel (which then goes in with
--no-deps): the layer depends on pyproject.toml's requirements only, so a change to kuberl's code
rebuilds a few megabytes, not the gigabytes of torch, Ray and transformers. Dockerfile.runtime leaves
torch out: the vLLM image holds the CUDA build its vLLM was compiled against. Standard library only.
"""

import argparse
import re
import tomllib
from pathlib import Path


def distribution_name(requirement: str) -> str:
    """`ray[default]>=2.40` -> `ray`, normalised as pip compares names (PEP 503)."""
    name = re.split(r"[\s\[<>=!~;(@]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(pyproject: Path, extras: list[str], exclude: set[str]) -> list[str]:
    """The project's own dependencies and those of `extras`, in pyproject.toml's order, minus `exclude`."""
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [extra for extra in extras if extra not in optional]
    if unknown:
        raise SystemExit(f"{pyproject} has no extra {unknown}; it has {sorted(optional)}")
    wanted = [*project.get("dependencies", []), *(req for extra in extras for req in optional[extra])]
    return [req for req in wanted if distribution_name(req) not in exclude]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pyproject", type=Path)
    parser.add_argument("extras", nargs="+", help="the extras to install (operator, runtime ...)")
    parser.add_argument("--exclude", action="append", default=[], help="distribution names to leave out")
    args = parser.parse_args()
    exclude = {distribution_name(name) for name in args.exclude}
    print("\n".join(requirements(args.pyproject, args.extras, exclude)))  # noqa: T201 - the script's output


if __name__ == "__main__":
    main()
