"""pytest runs only what `testpaths` lists (pyproject.toml orders the folders so the API server's build
overlaps the tests that need none): a test file outside every listed folder would never run, unless a make
target of its own runs its folder."""

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: Folders `make test` leaves out on purpose, and the target that runs each (hack/images/inputs.py: why and when).
RUN_BY_OTHER_TARGETS = {"tests/integration/images": "make test-images"}


def test_every_test_file_lies_under_a_listed_test_path() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    testpaths = [REPO / path for path in config["tool"]["pytest"]["ini_options"]["testpaths"]]
    testpaths += [REPO / path for path in RUN_BY_OTHER_TARGETS]
    unlisted = [
        str(test.relative_to(REPO))
        for test in (REPO / "tests").rglob("test_*.py")
        if not any(test.is_relative_to(path) for path in testpaths)
    ]
    assert unlisted == [], f"add their folders to [tool.pytest.ini_options] testpaths: {unlisted}"


def test_each_folder_left_out_of_make_test_is_run_by_its_target() -> None:
    makefile = (REPO / "Makefile").read_text()
    for folder, command in RUN_BY_OTHER_TARGETS.items():
        target = command.removeprefix("make ")
        recipe = makefile[makefile.index(f"\n{target}:") :].split("\n\n")[0]
        assert f"pytest {folder}" in recipe, f"`{command}` does not run {folder}"
