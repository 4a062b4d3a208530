"""What kuberl's images are built from, and whether `make test-images` passed on exactly that.

    python hack/images/inputs.py            # print the inputs' digests (what `make test-images` records)
    python hack/images/inputs.py check      # exit 1, naming what changed, when they differ from the record

Building and running the images (tests/integration/images) takes minutes even with cached layers, and ~15 minutes
cold on 2 cores, so it is not part of `make test`. Instead `make test-images` records, when it passed,
a digest of every input in docker/tested-inputs.txt (committed, like the generated CRDs); a unit test
(tests/unit/test_images.py) fails when the inputs moved since, and `.ci/run` runs `make
test-images` first in that case, on a clean clone, without any state of its own.

The inputs are what the images are built from and what proves them: docker/ and .dockerignore, the
build and base-image scripts (hack/images/), the image tests (tests/integration/images/), and of pyproject.toml
the tables a wheel and its requirements come from ([build-system], [project] without the dev and
bench extras, [tool.setuptools]), not the linters' or pytest's settings. kuberl's own code is not an
input: it changes with every feature, the rest of the suite tests it, and the images install it as a
wheel without dependencies. Standard library only (.ci/run may call it before the venv exists).
"""

import hashlib
import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RECORD = REPO / "docker" / "tested-inputs.txt"
INPUT_PATHS = ("docker", ".dockerignore", "hack/images", "tests/integration/images")
PYPROJECT_PART = "pyproject.toml [build-system] [project] [tool.setuptools], without the dev and bench extras"
#: Extras no image installs: changing them (a new linter, a benchmark's library) changes no image.
EXTRAS_NO_IMAGE_USES = ("dev", "bench")
HEADER = (
    "# Written by `make test-images` when it passed: the inputs it built and ran the images from\n"
    "# (hack/images/inputs.py says which). tests/unit/test_images.py compares them with the tree.\n"
)


def input_files() -> list[str]:
    """The input files git tracks or would track (ignored files such as __pycache__ are not inputs)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *INPUT_PATHS],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    record = str(RECORD.relative_to(REPO))
    return sorted({path for path in listed if path and path != record and (REPO / path).is_file()})


def pyproject_part(config: dict[str, Any]) -> bytes:
    """The tables of pyproject.toml the images are built from, as canonical JSON (formatting does not count)."""
    project = dict(config["project"])
    extras = project.get("optional-dependencies", {})
    project["optional-dependencies"] = {k: v for k, v in extras.items() if k not in EXTRAS_NO_IMAGE_USES}
    part = {
        "build-system": config["build-system"],
        "project": project,
        "setuptools": config["tool"]["setuptools"],
    }
    return json.dumps(part, sort_keys=True).encode()


def digests() -> dict[str, str]:
    """{input: sha256 of its content}."""
    found = {path: hashlib.sha256((REPO / path).read_bytes()).hexdigest() for path in input_files()}
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    found[PYPROJECT_PART] = hashlib.sha256(pyproject_part(pyproject)).hexdigest()
    return found


def render(found: dict[str, str]) -> str:
    return HEADER + "".join(f"{digest}  {name}\n" for name, digest in sorted(found.items()))


def parse(text: str) -> dict[str, str]:
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    return {name: digest for digest, _, name in (line.partition("  ") for line in lines)}


def changes(recorded: dict[str, str], current: dict[str, str]) -> list[str]:
    """What differs, one line each: `changed: x`, `new: y`, `removed: z`."""
    lines = [f"changed: {name}" for name in sorted(recorded.keys() & current.keys()) if recorded[name] != current[name]]
    lines += [f"new: {name}" for name in sorted(current.keys() - recorded.keys())]
    lines += [f"removed: {name}" for name in sorted(recorded.keys() - current.keys())]
    return lines


def check() -> int:
    recorded = parse(RECORD.read_text()) if RECORD.exists() else {}
    differences = changes(recorded, digests())
    if differences:
        print(  # noqa: T201 - the script's output
            f"the images' inputs changed since `make test-images` last passed ({RECORD.relative_to(REPO)}):\n  "
            + "\n  ".join(differences)
            + "\nrun `make test-images` (it records them when it passes) and commit the record"
        )
        return 1
    return 0


def main(argv: list[str]) -> int:
    if argv == ["check"]:
        return check()
    if argv:
        print(__doc__, file=sys.stderr)  # noqa: T201 - usage
        return 2
    sys.stdout.write(render(digests()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
