"""kuberl's own code starts processes only as argument lists, never through a shell (docs/security.md, Command lines).

The runtime starts three kinds of process itself: each reward function's isolation child
(runtime/rewards/isolated.py), the tool sandbox's launcher (runtime/sandbox/), which forks the jailed code, and a
worker pod's `ray start` (runtime/podinit.py, KubeRay's generated command split into a list); Ray, vLLM and torch
start their own workers. The operator, the API and the command line start none. Read from the source, so a new call
site is held to it too.
"""

import ast

from tests.conftest import REPO

PACKAGES = ("api", "operator", "runtime", "kuberl")
#: Calls that hand a string to a shell, or start a program: (module, function).
SHELLS = {("os", "system"), ("os", "popen"), ("subprocess", "getoutput"), ("subprocess", "getstatusoutput")}
STARTERS = {"Popen", "run", "call", "check_call", "check_output"}


def calls(tree: ast.AST) -> list[tuple[str, str, ast.Call]]:
    """(module, function, call) of every `module.function(...)` call."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if isinstance(owner, ast.Name):
                found.append((owner.id, node.func.attr, node))
    return found


def process_starts() -> dict[str, list[ast.Call]]:
    starts: dict[str, list[ast.Call]] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for module, function, call in calls(ast.parse(path.read_text())):
                if (module, function) in SHELLS or (module == "subprocess" and function in STARTERS):
                    starts.setdefault(str(path.relative_to(REPO)), []).append(call)
    return starts


def splits_a_string(node: ast.expr) -> bool:
    """`shlex.split(...)`: a list, split as a shell splits words, with nothing of a shell run."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and (node.func.value.id, node.func.attr) == ("shlex", "split")
    )


def test_processes_are_started_from_argument_lists_without_a_shell():
    starts = process_starts()
    assert sorted(starts) == ["runtime/podinit.py", "runtime/rewards/isolated.py", "runtime/sandbox/__init__.py"]
    for where, found in starts.items():
        for call in found:
            assert isinstance(call.func, ast.Attribute) and call.func.attr == "Popen", where
            assert isinstance(call.args[0], ast.List) or splits_a_string(call.args[0]), (
                f"{where}: the command is not an argument list"
            )
            shell = [keyword for keyword in call.keywords if keyword.arg == "shell"]
            assert not shell, f"{where}: shell= given"
