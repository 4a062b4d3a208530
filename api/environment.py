"""`spec.environment`: multi-turn episodes with tools instead of one response per prompt."""

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from kuberl.api.base import KuberlModel

#: Environments that ship with kuberl (package `kuberl.runtime.environments`).
BUILTIN_ENVIRONMENTS = ("python",)
#: The scratch folder of one tool call, in MiB: a tmpfs (memory the call holds beside toolMemoryMib).
TOOL_SCRATCH_MIB = 64
#: A built-in name, or `package.module:Class`.
ENVIRONMENT_REF_PATTERN = (
    r"^([A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*|[a-z][a-z0-9_]*)$"
)


#: `kuberl explain spec.environment`: how an episode runs.
ENVIRONMENT_DESCRIPTION = (
    "Multi-turn episodes instead of one response per prompt: the model writes a message, the environment "
    "answers (a tool's result, a user's reply, or done), the model writes again, up to maxTurns. An episode is "
    "one token sequence; only the model's tokens train (the environment's are context and carry no loss). "
    "Episodes of a batch advance concurrently: generation is batched over the episodes ready for their next "
    "turn while others wait on a tool. Tool calls are read in the tokenizer's chat-template format when it has "
    'one (<tool_call>{"name": ..., "arguments": {...}}</tool_call>, as Qwen2.5 and Hermes write them; needs '
    "data.chatTemplate: true), otherwise in the tagged format <python>code</python>, answered with "
    "<output>...</output> or <error>...</error>. A malformed call is answered with an error the model reads; it "
    "never ends the episode. The reward is the environment's own, or spec.reward scoring the model's final "
    "message; an environment that fails makes its episode a failed sample. Environments run on the reward pool's "
    "pods (resources.reward), one environment worker per pod beside its reward worker, the pod's CPUs split "
    "between the two (on the Ray head without a reward pool); resources.reward.podTemplate can set a "
    "runtimeClassName such as gVisor for them (docs/security.md). Default: none, one response per prompt."
)


class EnvironmentSpec(KuberlModel):
    """Multi-turn episodes with tools; the description of `RLJobSpec.environment` says how they run."""

    name: str = Field(
        pattern=ENVIRONMENT_REF_PATTERN,
        description="The environment: a built-in (" + ", ".join(BUILTIN_ENVIRONMENTS) + ": the model may run "
        "Python in a sandbox, with no network, a CPU-time, memory and wall-clock limit and a scratch folder that "
        "is removed afterwards; the episode ends at the first message without a tool call, which spec.reward "
        "scores) or `package.module:Class`, a subclass of kuberl.runtime.environments.Environment built from "
        "each dataset record.",
    )
    max_turns: int = Field(
        4, ge=1, le=256, description="Most messages the model writes in an episode; the episode ends after the last."
    )
    max_tokens_per_turn: int | None = Field(
        None,
        ge=1,
        le=131072,
        description="Most tokens the model writes in one message. Default: rollout.maxNewTokens (set one of the "
        "two, not both).",
    )
    max_episode_tokens: int = Field(
        1024,
        ge=1,
        le=1048576,
        description="Most tokens after the prompt in an episode, the model's and the environment's together: the "
        "episode ends when the next message would not fit. data.maxPromptLength plus this must fit the model's "
        "context. It is the response length the loss normalises by and the overlong penalty measures against.",
    )
    tool_timeout_seconds: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="Wall-clock limit of one tool call (it also bounds the call's CPU time). A call past it is "
        "stopped and the model reads an error.",
    )
    tool_memory_mib: int = Field(
        512,
        ge=64,
        le=1048576,
        description="Memory one tool call may use, in MiB: all the processes it starts together (a memory cgroup "
        "where the worker may make one, else an even share per process it may start). Past it an allocation "
        f"fails, or the call is stopped, and the model reads the error. Its scratch folder ({TOOL_SCRATCH_MIB} MiB) "
        "comes on top. An environment worker runs one call per CPU at once; a reward pool that runs tools and "
        "sets no memory gets enough for that.",
    )

    @field_validator("name")
    @classmethod
    def _builtin_exists(cls, value: str) -> str:
        if ":" not in value and value not in BUILTIN_ENVIRONMENTS:
            raise PydanticCustomError(
                "unknown_environment",
                "unknown built-in environment '{name}'; built-ins are {known}, or name your own as "
                "package.module:Class",
                {"name": value, "known": ", ".join(BUILTIN_ENVIRONMENTS)},
            )
        return value
