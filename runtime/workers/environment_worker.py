"""The environment worker: holds the environments of many episodes and answers their steps concurrently.

One worker is one Ray actor with many threads (`max_concurrency`), placed like a reward worker (the
`kuberl_reward` resource: on Kubernetes, a reward pod, whose pod template can ask for a sandboxing
runtime class). Each episode's environment lives in one worker for the whole episode; steps of
different episodes run in parallel threads, so a tool that waits (a sandboxed process, a request)
holds up only its own episode. The sandboxed tool calls among them run at most `calls_at_once` at a
time (one per CPU of the worker, api/topology.py), each held to its memory limit: what the worker's
pod must hold is bounded, not 32 calls' worth. A step of one episode never runs beside another step of the same
episode: the scheduler sends an episode's next turn only after its observation came back.

Every call returns an `EnvironmentReply` and never raises for the environment's sake: an environment
that raises fails its episode (`failed` set), the worker and the other episodes go on.
"""

import logging
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from kuberl.api import EnvironmentSpec
from kuberl.runtime.environments.base import Environment, EnvironmentSettings, ModelTurn, Observation
from kuberl.runtime.environments.registry import load_environment
from kuberl.runtime.rewards.functions import RewardResult, checked_reward

log = logging.getLogger(__name__)

#: Steps one environment worker runs at once (threads): tool calls mostly wait on a process, and the sandbox runs
#: at most `calls_at_once` of them at a time (the others wait their turn).
STEPS_IN_PARALLEL = 32


@dataclass
class EnvironmentReply:
    observation: Observation | None = None  # None when the episode ended here (finish) or failed
    reward: RewardResult | None = None  # at the end: the environment's reward (None: spec.reward scores)
    failed: str | None = None  # the environment raised: the episode is a failed sample
    seconds: float = 0.0  # time spent in the environment's code
    metrics: dict[str, float] = field(default_factory=dict)


class EnvironmentWorker:
    def __init__(self, rank: int = 0, world_size: int = 1) -> None:
        self.rank = rank
        self.environment_class: type[Environment] | None = None
        self.settings = EnvironmentSettings()
        self.episodes: dict[tuple[int, int], Environment] = {}  # (rollout id, row) -> its environment

    def setup(self, environment: dict[str, Any], calls_at_once: int = 1) -> dict[str, Any]:
        """Loads the environment class; proves the sandbox works here when the environment runs code, and lets it
        run `calls_at_once` calls at a time."""
        spec = EnvironmentSpec.model_validate(environment)
        self.environment_class = load_environment(spec.name)
        self.settings = EnvironmentSettings(spec.max_turns, spec.tool_timeout_seconds, spec.tool_memory_mib)
        if self.environment_class.needs_sandbox:
            from kuberl.runtime.sandbox import check_isolation, memory_bound, set_calls_at_once

            check_isolation()
            set_calls_at_once(calls_at_once)
            log.info("tool calls: %d at once, each held to its memory limit by %s", calls_at_once, memory_bound())
        return {"rank": self.rank, "environment": self.environment_class.__qualname__}

    def begin(self, rollout: int) -> int:
        """A new rollout starts: closes what earlier rollouts left (an interrupted step); returns how many."""
        stale = [key for key in self.episodes if key[0] != rollout]
        for key in stale:
            self._close(self.episodes.pop(key, None))
        return len(stale)

    def step(self, key: tuple[int, int], sample: dict[str, Any], turn: ModelTurn) -> EnvironmentReply:
        """The observation answering the model's turn; at the end of the episode, its reward too."""
        started = time.perf_counter()
        try:
            environment = self.episodes.get(key)
            if environment is None:
                assert self.environment_class is not None, "setup() first"
                environment = self.environment_class(sample, self.settings)
                self.episodes[key] = environment
            observation = environment.step(turn)
            if not isinstance(observation, Observation):
                raise TypeError(f"step() returned {type(observation).__name__}, not an Observation")
            reply = EnvironmentReply(observation, metrics=dict(observation.metrics))
            if observation.done:
                reply.reward = self._reward(key, turn)
        except Exception as error:  # an environment's bug fails its episode, not the job
            reply = self._failure(key, error)
        reply.seconds = time.perf_counter() - started
        return reply

    def finish(self, key: tuple[int, int], sample: dict[str, Any], final: ModelTurn) -> EnvironmentReply:
        """The episode ended on the rollout's side (maxTurns, the token budget): its reward."""
        started = time.perf_counter()
        try:
            if key not in self.episodes:  # ended before any step (a first message cut by the budget)
                assert self.environment_class is not None, "setup() first"
                self.episodes[key] = self.environment_class(sample, self.settings)
            reply = EnvironmentReply(reward=self._reward(key, final))
        except Exception as error:  # an environment's bug fails its episode, not the job
            reply = self._failure(key, error)
        reply.seconds = time.perf_counter() - started
        return reply

    def _reward(self, key: tuple[int, int], final: ModelTurn) -> RewardResult | None:
        environment = self.episodes.pop(key)
        try:
            value = environment.reward(final)
        finally:
            self._close(environment)
        if value is None:
            return None
        return checked_reward(value, f"environment {type(environment).__qualname__}.reward()")

    def _failure(self, key: tuple[int, int], error: Exception) -> EnvironmentReply:
        self._close(self.episodes.pop(key, None))
        where = traceback.extract_tb(error.__traceback__)[-1]
        reason = f"{type(error).__name__}: {error} ({where.filename}:{where.lineno})"
        return EnvironmentReply(failed=reason)

    @staticmethod
    def _close(environment: Environment | None) -> None:
        if environment is None:
            return
        try:
            environment.close()
        except Exception:  # noqa: BLE001 - a failing close() must not fail the step that ended the episode
            traceback.print_exc()
