"""Environments for the runtime tests, named in manifests as tests.integration.runtime.environments:NAME.

Each one is a real Environment run by the real environment workers; they differ from a production
environment only in being simple enough that a random tiny model exercises every path.
"""

import threading
import time

from kuberl.runtime.environments import Environment, ModelTurn, Observation


class Replies(Environment):
    """Answers every message with a short user reply, so episodes run to maxTurns; a record's `delay`
    makes its episodes' first step take that many seconds (a slow tool)."""

    def step(self, turn: ModelTurn) -> Observation:
        delay = float(self.sample.get("delay", 0.0))
        if delay and not getattr(self, "waited", False):
            self.waited = True
            time.sleep(delay)
        return Observation.user(" ok.")


class FailsOnSecondTurn(Environment):
    """Raises on the second message of episodes whose record says so: an environment with a bug."""

    def __init__(self, sample, settings) -> None:
        super().__init__(sample, settings)
        self.turns = 0

    def step(self, turn: ModelTurn) -> Observation:
        self.turns += 1
        if self.turns == 2 and self.sample.get("fail"):
            raise RuntimeError("the environment broke")
        return Observation.user(" again.")


class ScoresTurns(Environment):
    """Gives its own reward: the number of messages the model wrote, so rewards are known by turn count."""

    def __init__(self, sample, settings) -> None:
        super().__init__(sample, settings)
        self.turns = 0

    def step(self, turn: ModelTurn) -> Observation:
        self.turns += 1
        return Observation.end() if self.turns >= int(self.sample.get("stop_after", 2)) else Observation.user(" more.")

    def reward(self, final: ModelTurn) -> float:
        return float(self.turns)


class WaitsForTheOthers(Environment):
    """A slow tool, provoked rather than timed: an episode whose record has `wait_for` blocks its first
    step until that many other episodes of the same worker have ended (or 60 s pass). A rollout that
    held the other episodes back until this step came back could never satisfy it."""

    ended = 0
    condition = threading.Condition()

    def step(self, turn: ModelTurn) -> Observation:
        wait_for = int(self.sample.get("wait_for", 0))
        if wait_for and not getattr(self, "waited", False):
            self.waited = True
            with WaitsForTheOthers.condition:
                WaitsForTheOthers.condition.wait_for(lambda: WaitsForTheOthers.ended >= wait_for, timeout=60)
        return Observation.user(" ok.")

    def reward(self, final: ModelTurn) -> None:
        with WaitsForTheOthers.condition:
            WaitsForTheOthers.ended += 1
            WaitsForTheOthers.condition.notify_all()
        return None


class FlakyReplies(Environment):
    """Replies like `Replies`, but breaks on the second message of prompts whose first number is a multiple
    of 5: a deterministic share of every batch are failed samples. It scores an episode by the number of words
    in the model's last message (the demo's reward, which scores counting, gives the tiny model's episodes 0),
    so sampled episodes score differently and the model learns."""

    def __init__(self, sample, settings) -> None:
        super().__init__(sample, settings)
        self.turns = 0

    def step(self, turn: ModelTurn) -> Observation:
        self.turns += 1
        if self.turns == 2 and int(self.sample["prompt"].split()[1]) % 5 == 0:
            raise RuntimeError("flaky environment")
        return Observation.user(" ok.")

    def reward(self, final: ModelTurn) -> float:
        return float(len(final.text.split()))
