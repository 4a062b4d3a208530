"""pytest runs only what `testpaths` lists (pyproject.toml orders the folders so the API server's build
overlaps the tests that need none): a test file outside every listed folder would never run."""

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_test_file_lies_under_a_listed_test_path() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    testpaths = [REPO / path for path in config["tool"]["pytest"]["ini_options"]["testpaths"]]
    unlisted = [
        str(test.relative_to(REPO))
        for test in (REPO / "tests").rglob("test_*.py")
        if not any(test.is_relative_to(path) for path in testpaths)
    ]
    assert unlisted == [], f"add their folders to [tool.pytest.ini_options] testpaths: {unlisted}"
