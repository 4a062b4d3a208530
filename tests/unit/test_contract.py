"""api/contract.py is the one place the operator and the runtime spell what they agree on.

A scan of the source fails on a stray copy of any of its literals; the runtime's command line reads
back what the operator writes; the Helm chart sets only settings the contract names.
"""

import ast
import re
from pathlib import Path

import pytest

from kuberl.api import Role, contract
from kuberl.api.contract import RUNTIME_PROGRAM, RuntimeArgs, parse_runtime_args, runtime_command
from kuberl.api.topology import HEAD_POOL
from tests.conftest import REPO

SCANNED = ("api", "operator", "runtime", "kuberl")
#: The lead engineer's check, verbatim: none of these outside api/contract.py.
GREP = re.compile(r'"/checkpoints"|kuberl_\{|"KUBERL_[A-Z_]+"')
POOLS = (HEAD_POOL, *(role.value for role in Role))


def contract_literals() -> set[str]:
    """Every string the contract defines, the command line's flags and each pool's Ray resource."""
    names = {value for value in vars(contract).values() if isinstance(value, str)}
    flags = {arg for arg in runtime_command(RuntimeArgs(spec="x", output="y", address="z", resume=True)) if "--" in arg}
    # The program's module, not "python" or "-m": those start any module (the reward isolation's child too).
    return names | flags | {contract.ray_resource(pool) for pool in POOLS} | {RUNTIME_PROGRAM[-1]}


def contract_numbers() -> dict[int, str]:
    """The numbers the contract defines, by what they are: its ports and the runtime's "resume me" exit code."""
    ports = {value: name for name, value in vars(contract).items() if name.endswith("_PORT") and type(value) is int}
    return ports | {int(contract.ExitCode.RESUMABLE): "exit code"}


def stray_copies(source: str, literals: set[str]) -> list[str]:
    """Where `source` spells a contract literal (a whole string constant) or number, or builds a Ray resource name."""
    numbers = contract_numbers()
    found = [f"line {match.string.count(chr(10), 0, match.start()) + 1}: {match[0]}" for match in GREP.finditer(source)]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in literals:
            found.append(f"line {node.lineno}: {node.value!r}")
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value in numbers:
            found.append(f"line {node.lineno}: {numbers[node.value]} {node.value}")
    return found


def sources() -> list[Path]:
    return [path for folder in SCANNED for path in sorted((REPO / folder).rglob("*.py"))]


def test_the_scan_finds_a_stray_copy():
    literals = contract_literals()
    assert stray_copies('TOKEN = "KUBERL_REWARD_ENDPOINT_TOKEN"\n', literals)
    assert stray_copies('MOUNT = "/etc/kuberl"\n', literals)
    assert stray_copies('flag = "--resume"\n', literals)
    assert stray_copies('name = "kuberl_actor"\n', literals)
    assert stray_copies('def resource(role):\n    return f"kuberl_{role}"\n', literals)
    assert stray_copies("EXIT_RESUMABLE = 75\n", literals)
    assert stray_copies("METRICS_PORT = 9464\n", literals)
    assert stray_copies('HEAD_PORTS = ({"containerPort": 6379, "name": "gcs"},)\n', literals)
    assert stray_copies('ingress = {"ports": [{"protocol": "TCP", "port": 8265}]}\n', literals)
    assert stray_copies("address = ray_client(port=10001)\n", literals)
    assert not stray_copies('log = "kuberl_operator_jobs"  # a Prometheus name, not a pool\n', literals)


@pytest.mark.parametrize("path", sources(), ids=lambda path: str(path.relative_to(REPO)))
def test_no_source_outside_the_contract_spells_its_literals(path: Path):
    if path == REPO / "api" / "contract.py":
        return
    assert stray_copies(path.read_text(), contract_literals()) == []


@pytest.mark.parametrize(
    "args",
    [
        RuntimeArgs(spec=contract.SPEC_PATH),
        RuntimeArgs(spec=contract.SPEC_PATH, resume=True),
        RuntimeArgs(spec="job.yaml", output="runs/a b", address="ray://head:10001", resume=True),
    ],
)
def test_the_runtime_parses_back_the_command_line_it_is_given(args: RuntimeArgs):
    argv = runtime_command(args)
    assert tuple(argv[: len(RUNTIME_PROGRAM)]) == RUNTIME_PROGRAM
    assert parse_runtime_args(argv[len(RUNTIME_PROGRAM) :]) == args


def test_the_chart_sets_only_operator_settings_the_contract_names():
    named = {value for key, value in vars(contract).items() if key.endswith("_ENV")}
    templates = (REPO / "charts" / "kuberl" / "templates").rglob("*")
    used = {name for path in templates if path.is_file() for name in re.findall(r"KUBERL_[A-Z_]+", path.read_text())}
    assert used and used <= named, used - named
