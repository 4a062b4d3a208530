"""The built-in `python` environment: the model may run Python in the sandbox before it answers.

    <python>37 * 48</python>          the model's call (tagged format; or a <tool_call> in chat templates)
    <output>1776</output>             what the sandbox printed (a final expression is printed, as in a notebook)
     1776                             the model's answer: a message without a call ends the episode

Each call runs in a fresh sandbox (kuberl.runtime.sandbox): no network, a scratch folder of 64 MiB
(TOOL_SCRATCH_MIB) that goes with the call, spec.environment.toolTimeoutSeconds of wall-clock and CPU
time, toolMemoryMib of memory for all the processes the call starts together.
Code that fails, runs too long or allocates too much is answered with an error and the episode goes
on. The episode's reward is spec.reward scoring the model's final message.
"""

from kuberl.api.environment import TOOL_SCRATCH_MIB
from kuberl.runtime.environments.tools import ToolEnvironment, ToolResult, function_schema
from kuberl.runtime.sandbox import Limits, Outcome, run_python

#: What the model reads of a call's output; the rest is cut (it would only eat the episode's token budget).
OUTPUT_CHARS = 2048


def describe(outcome: Outcome, limits: Limits) -> ToolResult:
    """What the model reads of a sandbox run."""
    if outcome.stopped_by == "wall_time":
        return ToolResult(f"stopped: the code ran past its {limits.wall_seconds:g} s time limit", error=True)
    if outcome.stopped_by == "cpu_time":
        return ToolResult(f"stopped: the code used more than {limits.cpu_seconds:g} s of CPU time", error=True)
    if outcome.stopped_by == "memory":
        return ToolResult(
            f"MemoryError: the code may use at most {limits.memory_bytes >> 20} MiB, all its processes together",
            error=True,
        )
    if outcome.stopped_by is not None:
        return ToolResult(f"stopped: {outcome.stopped_by}", error=True)
    if outcome.exit_code != 0:
        lines = outcome.stderr.strip().splitlines()
        return ToolResult(_cut("\n".join(lines[-4:]) or f"exit status {outcome.exit_code}"), error=True)
    return ToolResult(_cut(outcome.stdout.rstrip("\n")))


def _cut(text: str) -> str:
    return text if len(text) <= OUTPUT_CHARS else text[:OUTPUT_CHARS] + " [cut]"


class PythonEnvironment(ToolEnvironment):
    tool_schemas = (
        function_schema(
            "python",
            "Run Python 3 code in a sandbox (no network; a scratch folder as working directory) and return what it "
            "prints. The value of a final expression is printed too.",
            {"code": {"type": "string", "description": "The code to run."}},
            ["code"],
        ),
    )
    needs_sandbox = True

    def tool_python(self, code: str) -> ToolResult:
        seconds = self.settings.tool_timeout_seconds
        limits = Limits(
            wall_seconds=seconds,
            cpu_seconds=seconds,
            memory_bytes=self.settings.tool_memory_mib << 20,
            scratch_bytes=TOOL_SCRATCH_MIB << 20,
        )
        return describe(run_python(str(code), limits), limits)
