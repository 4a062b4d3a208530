"""Multi-turn environments: what the model acts on over an episode (spec.environment).

    base.py          Environment, ModelTurn, Observation: the interface a user implements
    tools.py         ToolEnvironment: answers tool calls; python.py: the built-in `python` environment
    registry.py      built-ins and `package.module:Class`
    tool_formats.py  reading tool calls out of a message, writing observations for the tokenizer
    episode.py       one episode's token sequence and the batch built from a step's episodes
    scheduler.py     episodes of a batch advancing concurrently over the engines and environment workers

The environment workers' pool is `runtime/pools/environment.py`, and the rollout stage that runs episodes is
`runtime/rollout/episodes.py`.

The code a tool runs is confined by `kuberl.runtime.sandbox`, which knows nothing of RL.
"""

from kuberl.runtime.environments.base import (
    Environment,
    EnvironmentSettings,
    Message,
    ModelTurn,
    Observation,
    Role,
    ToolCall,
)
from kuberl.runtime.environments.registry import BUILTIN_ENVIRONMENTS, EnvironmentConfigError, load_environment
from kuberl.runtime.environments.tools import ToolEnvironment, ToolResult, function_schema

__all__ = [
    "BUILTIN_ENVIRONMENTS",
    "Environment",
    "EnvironmentConfigError",
    "EnvironmentSettings",
    "Message",
    "ModelTurn",
    "Observation",
    "Role",
    "ToolCall",
    "ToolEnvironment",
    "ToolResult",
    "function_schema",
    "load_environment",
]
