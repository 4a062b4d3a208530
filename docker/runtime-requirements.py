"""Print the requirements of a kuberl wheel's extra, leaving out what the base image must provide.

    python runtime-requirements.py /wheels/kuberl-0.1.0-py3-none-any.whl runtime --exclude torch

Used by Dockerfile.runtime: the vLLM image already holds the torch (CUDA build) its vLLM was built
against, and `pip install "kuberl[runtime]"` would otherwise try to replace it with the CPU pin
of the `runtime` extra. Standard library only.
"""

import argparse
import re
import zipfile
from email.parser import Parser


def extra_requirements(wheel: str, extra: str, exclude: set[str]) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        metadata_name = next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(archive.read(metadata_name).decode())
    wanted = []
    for requirement in metadata.get_all("Requires-Dist") or []:
        spec, _, marker = requirement.partition(";")
        if not re.search(rf"""extra\s*==\s*["']{re.escape(extra)}["']""", marker):
            continue
        name = re.split(r"[\s\[<>=!~;(]", spec.strip(), maxsplit=1)[0]
        if name.lower().replace("_", "-") not in exclude:
            wanted.append(spec.strip())
    if not wanted:
        raise SystemExit(f"{wheel} has no requirements for extra {extra!r}")
    return wanted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel")
    parser.add_argument("extra")
    parser.add_argument("--exclude", action="append", default=[], help="distribution names to leave out")
    args = parser.parse_args()
    exclude = {name.lower().replace("_", "-") for name in args.exclude}
    print("\n".join(extra_requirements(args.wheel, args.extra, exclude)))  # noqa: T201 - the script's output


if __name__ == "__main__":
    main()
