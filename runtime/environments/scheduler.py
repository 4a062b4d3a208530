"""Episodes of a batch advancing concurrently: generation batched over the ready episodes, tools in parallel.

An episode is always in one of three places: ready (waiting for an engine to write its next message),
generating (inside one engine call), or with its environment (a step in an environment worker). The
scheduler is one event loop in the controller over Ray futures:

    while episodes are not done:
        every free engine takes a share of the ready episodes, as one generation call
        wait for the first call or step to come back (ray.wait)
        a generation: each episode's message goes to its environment (one step each, all in flight at once)
        a step: the observation is appended and the episode is ready again (or it is done)

So a slow tool holds back only its own episode: while it runs, the others' observations come back and
their next messages are generated, batched with whatever else is ready. No barrier per turn, unlike
verl's synchronous multi-turn rollout (its agent loop, like this, runs episodes asynchronously).

Determinism: each episode's turn draws from its own seeds (`SamplingParams.row_seeds`), so which
episodes share a generation call (which depends on timing) does not change what an episode samples.
The engine's log-prob of a token can still differ in its last bits with the call's batch (the float
sums of a batched forward pass), which in principle could flip a sample at a near-tie; the tokens of
the runs here replay exactly (tests/integration/runtime/test_environment_runs.py resumes bit-identically).
"""

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import numpy as np
import ray

from kuberl.runtime.deadline import current_deadline
from kuberl.runtime.engines.base import Generation, SamplingParams
from kuberl.runtime.environments.episode import Episode
from kuberl.runtime.environments.tool_formats import ToolFormat
from kuberl.runtime.rewards.functions import RewardResult


class Engines(Protocol):
    @property
    def size(self) -> int: ...

    def submit(self, rank: int, prompts: list[list[int]], params: SamplingParams) -> Any: ...


class Environments(Protocol):
    def step(self, row: int, sample: dict[str, Any], turn: Any) -> Any: ...

    def finish(self, row: int, sample: dict[str, Any], final: Any) -> Any: ...


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int
    max_turn_tokens: int
    max_episode_tokens: int


@dataclass(frozen=True)
class Span:
    """One piece of an episode rollout's work, as the controller saw it (perf_counter seconds)."""

    kind: str  # "generate" (one engine call) or "environment" (one step or finish of one episode)
    rows: tuple[int, ...]
    worker: int  # the engine's rank; -1 for environment work
    started: float
    ended: float
    context_tokens: int = 0  # generate: the tokens the engine read (prompt and episode so far)
    cached_tokens: int = 0  # generate: of those, the ones served from the engine's prefix cache


#: Makes the sampling of one generation call: its episodes and each one's token budget for this message.
TurnSampling = Callable[[list[Episode], list[int]], SamplingParams]


class EpisodeScheduler:
    def __init__(
        self,
        engines: Engines,
        environments: Environments,
        tool_format: ToolFormat,
        tokenizer: Any,
        limits: EpisodeLimits,
        sampling: TurnSampling,
    ) -> None:
        self.engines = engines
        self.environments = environments
        self.format = tool_format
        self.tokenizer = tokenizer
        self.limits = limits
        self.sampling = sampling
        self.end_of_turn = tokenizer.eos_token_id

    def run(self, episodes: list[Episode]) -> list[Span]:
        """Plays every episode to its end (in place); returns what ran when."""
        self.ready: deque[Episode] = deque(episodes)
        self.free = list(range(self.engines.size))
        self.pending: dict[Any, tuple[Callable[[Any], None], Callable[[BaseException], None]]] = {}
        self.spans: list[Span] = []
        while self.ready or self.pending:
            self._dispatch()
            deadline = current_deadline()  # spec.training.stepTimeoutSeconds bounds the whole rollout
            finished, _ = ray.wait(
                list(self.pending), num_returns=1, timeout=None if deadline is None else deadline.time_left()
            )
            if not finished:
                assert deadline is not None
                raise deadline.exceeded(f"{len(self.pending)} episodes' generations and environment steps")
            finished, _ = ray.wait(list(self.pending), num_returns=len(self.pending), timeout=0)  # all that are in
            for ref in finished:
                on_result, on_error = self.pending.pop(ref)
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayError as error:
                    on_error(error)
                    continue
                on_result(result)
        return self.spans

    # -- generation ---------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        """Every free engine takes an equal share of the ready episodes (lowest rows first), as one call."""
        if not self.ready or not self.free:
            return
        ready = sorted(self.ready, key=lambda episode: episode.row)
        self.ready.clear()
        engines = self.free[: len(ready)]
        self.free = self.free[len(engines) :]
        for rank, share in zip(engines, np.array_split(np.arange(len(ready)), len(engines)), strict=True):
            chunk = [ready[i] for i in share]
            budgets = [self._turn_budget(episode) for episode in chunk]
            contexts = [episode.context for episode in chunk]
            ref = self.engines.submit(rank, contexts, self.sampling(chunk, budgets))
            context = sum(len(tokens) for tokens in contexts)
            self.pending[ref] = (
                partial(self._generated, rank, chunk, time.perf_counter(), context),
                self._engine_failed,
            )

    def _turn_budget(self, episode: Episode) -> int:
        room = self.limits.max_episode_tokens - len(episode.response)
        return max(1, min(self.limits.max_turn_tokens, room))  # an episode is ready only with room left

    def _generated(
        self, rank: int, chunk: list[Episode], started: float, context: int, result: list[list[Generation]]
    ) -> None:
        self.free.append(rank)
        cached = sum(generations[0].cached_tokens for generations in result)
        rows = tuple(e.row for e in chunk)
        self.spans.append(Span("generate", rows, rank, started, time.perf_counter(), context, cached))
        for episode, generations in zip(chunk, result, strict=True):
            generation = generations[0]
            episode.add_model_turn(generation.token_ids, generation.logprobs)
            episode.cached_tokens += generation.cached_tokens
            text = self.tokenizer.decode(generation.token_ids, skip_special_tokens=True)
            episode.final = self.format.read(text, cut=generation.finish_reason == "length")
            closed = bool(generation.token_ids) and generation.token_ids[-1] == self.end_of_turn
            if episode.turns >= self.limits.max_turns:
                self._finish(episode, "max_turns")
            elif len(episode.response) >= self.limits.max_episode_tokens:
                self._finish(episode, "budget")
            else:
                self._step(episode, closed)

    def _engine_failed(self, error: BaseException) -> None:
        raise error  # a lost engine ends the step, as it does in a single-turn rollout

    # -- environment --------------------------------------------------------------------------------
    def _step(self, episode: Episode, closed: bool) -> None:
        ref = self.environments.step(episode.row, episode.prompt.record, episode.final)
        started = time.perf_counter()
        self.pending[ref] = (partial(self._observed, episode, started, closed), partial(self._lost, episode, started))

    def _observed(self, episode: Episode, started: float, closed: bool, reply: Any) -> None:
        self.spans.append(Span("environment", (episode.row,), -1, started, time.perf_counter()))
        episode.add_metrics(reply.metrics)
        if reply.failed is not None:
            self._fail(episode, f"environment failed: {reply.failed}")
            return
        observation = reply.observation
        if observation.done:
            episode.ended_by, episode.reward = "environment", reply.reward
            return
        text = self.format.render(observation.messages, closed)
        token_ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        if len(episode.response) + len(token_ids) >= self.limits.max_episode_tokens:
            self._finish(episode, "budget")  # no room left for the model to read it and answer
            return
        episode.add_observation(token_ids)
        self.ready.append(episode)

    def _finish(self, episode: Episode, why: str) -> None:
        ref = self.environments.finish(episode.row, episode.prompt.record, episode.final)
        started = time.perf_counter()
        self.pending[ref] = (partial(self._finished, episode, started, why), partial(self._lost, episode, started))

    def _finished(self, episode: Episode, started: float, why: str, reply: Any) -> None:
        self.spans.append(Span("environment", (episode.row,), -1, started, time.perf_counter()))
        if reply.failed is not None:
            self._fail(episode, f"environment failed: {reply.failed}")
            return
        episode.ended_by, episode.reward = why, reply.reward

    def _lost(self, episode: Episode, started: float, error: BaseException) -> None:
        self.spans.append(Span("environment", (episode.row,), -1, started, time.perf_counter()))
        self._fail(episode, f"environment worker lost: {type(error).__name__}: {error}")

    @staticmethod
    def _fail(episode: Episode, reason: str) -> None:
        episode.ended_by = "failed"
        episode.reward = RewardResult(0.0, {}, error=reason)
