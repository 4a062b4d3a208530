"""Real bash running a launch script with `python3` defined as a function that prints its arguments and ends the
script: what the converter's shell reader is held to. The scripts are the tests' own; `ray` (a launcher) and
`ulimit` are functions too, so nothing outside the temporary folder is touched."""

import subprocess
from pathlib import Path

STUBS = (
    'python3() { printf "%s\\0" "$@"; exit 0; }\n'
    'python() { python3 "$@"; }\n'
    'ray() { while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do shift; done; shift; "$@"; }\n'
    "ulimit() { :; }\n"
)


def bash_arguments(script: str, folder: Path, environment: dict[str, str]) -> list[str]:
    """The arguments bash passes to `python3` when it runs the script in `folder` (its $PWD) with no arguments;
    [] when it never gets there."""
    done = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", STUBS + script],
        env=environment | {"PWD": str(folder)},
        cwd=folder,
        capture_output=True,
        timeout=20,
        check=False,
    )
    return done.stdout.decode().split("\0")[:-1]
