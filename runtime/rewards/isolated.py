"""A reward function in a child process of its own, so that one call that never returns can be stopped.

    function = IsolatedRewardFunction("my_pkg.rewards:judge", timeout_s=60)
    results = function.score(completions, samples)   # one RewardResult per sample, in order
    function.close()

Python cannot stop a thread, and a reward function is arbitrary user code: it may sleep on a socket,
loop, or backtrack in a regular expression for hours. So the function runs in a child process
(`python -m kuberl.runtime.rewards.isolated REF FD`), which loads it by its manifest name and scores
the samples it is sent one by one, answering each with `score_safely`'s RewardResult over a socket
pair. The parent waits at most `timeout_s` for each answer; a sample that takes longer fails (score
0.0, the reason in `error`), the child is killed, and a new one scores the rest of the batch. A child
that dies on a sample (a segfault, os._exit, the OOM killer) fails that sample the same way.

This is verl's approach for its `prime` reward manager (a process pool with a per-sample timeout whose
processes are killed on timeout), with one long-lived child per reward worker instead of a pool: the
pool's workers are the parallelism here. The child exits when its parent does: a thread in it watches
the parent's pid (not PR_SET_PDEATHSIG, which fires when the *thread* that started the child ends, and
Ray may run a task on a thread that ends). A child stuck in C code that holds the GIL cannot run that
thread; the parent kills it at the sample's deadline, but if the reward worker itself is killed first
such a child runs on until its call returns.
"""

import json
import os
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from kuberl.runtime.rewards.functions import RewardResult, load_reward_function, score_safely

#: The child's first message: it has imported the function. The per-sample clock starts after it, so a
#: reward module that takes long to import (torch, a tokenizer) does not eat into the first sample's time.
READY = "ready"
#: The longest a child may take to start and import the function.
START_TIMEOUT_S = 300.0


class IsolatedRewardFunction:
    """The reward function `ref` (a built-in name or package.module:function) in a child process."""

    def __init__(self, ref: str, timeout_s: float, field: str = "spec.reward.function") -> None:
        load_reward_function(ref, field)  # here too: a typo fails setup with the error that names the field
        self.ref = ref
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._child: subprocess.Popen[bytes] | None = None
        self._connection: Connection | None = None
        self._failure = ""
        self._start()

    def _start(self) -> None:
        mine, theirs = socket.socketpair()
        # The child imports the function from where this process would (Ray adds the driver's folder to
        # sys.path). Appended once it has started, as multiprocessing's spawn does: in PYTHONPATH a folder
        # could shadow the standard library before it loads (this repository's operator/ would). -P likewise:
        # `-m` would put the working directory first, and from Python 3.12 on a run started in a checkout of this
        # repository had every isolated reward's process fail at its first import. The working directory is on
        # this process's path as '' when it was started so: the child gets it by name, appended too.
        path = json.dumps([entry or os.getcwd() for entry in sys.path])
        try:
            self._child = subprocess.Popen(
                [sys.executable, "-P", "-m", "kuberl.runtime.rewards.isolated", self.ref, str(theirs.fileno()), path],
                pass_fds=(theirs.fileno(),),
            )
        finally:
            theirs.close()
        self._connection = Connection(mine.detach())
        try:
            ready = self._connection.poll(START_TIMEOUT_S) and self._connection.recv() == READY
        except (EOFError, OSError):
            ready = False
        if not ready:
            try:
                code: int | None = self._child.wait(timeout=5)  # one that closed its end has ended, or is ending
            except subprocess.TimeoutExpired:
                code = None
            self._stop()
            raise RuntimeError(
                f"the process for reward {self.ref} ended with exit code {code} before it was ready; its error is "
                "in this worker's log"
                if code is not None
                else f"the process for reward {self.ref} did not start within {START_TIMEOUT_S:g} s"
            )

    def _stop(self) -> None:
        if self._child is not None:
            self._child.kill()
            self._child.wait()
        if self._connection is not None:
            self._connection.close()
        self._child, self._connection = None, None

    def score(self, completions: list[str], samples: list[dict[str, Any]]) -> list[RewardResult]:
        """One result per (completion, sample); never raises for what the function does."""
        if len(completions) != len(samples):
            raise ValueError(f"{len(completions)} completions but {len(samples)} samples; they must pair up")
        with self._lock:
            pending = list(zip(completions, samples, strict=True))
            results: list[RewardResult] = []
            while pending:
                if self._connection is None:
                    self._start()
                assert self._connection is not None
                try:
                    self._connection.send(pending)
                except OSError:  # the child died after its last answer: a new one takes the batch
                    self._stop()
                    self._start()
                    assert self._connection is not None
                    self._connection.send(pending)  # a second failure is the caller's (the pool retries)
                answered = self._collect(len(pending), results)
                pending = pending[answered:]
                if pending:  # the sample at the head of `pending` failed and the child is gone
                    results.append(RewardResult(0.0, {}, error=self._failure))
                    pending = pending[1:]
            return results

    def _collect(self, count: int, results: list[RewardResult]) -> int:
        """Receives up to `count` answers; on a timeout or a dead child, stops it and returns how many came."""
        assert self._connection is not None and self._child is not None
        for answered in range(count):
            started = time.monotonic()
            try:
                if not self._connection.poll(self.timeout_s):
                    self._failure = (
                        f"reward {self.ref} took longer than {self.timeout_s:g} s on this sample "
                        "(spec.reward.sampleTimeoutSeconds) and was stopped"
                    )
                    self._stop()
                    return answered
                results.append(self._connection.recv())
            except (EOFError, OSError):
                code = self._child.wait()
                self._failure = (
                    f"reward {self.ref} ended its process (exit code {code}) on this sample "
                    f"after {time.monotonic() - started:.1f} s"
                )
                self._stop()
                return answered
        return count

    def close(self) -> None:
        with self._lock:
            self._stop()


def _die_with_parent() -> None:
    """The child must not outlive the reward worker, even when it is stuck in the user's code."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="kuberl-reward-parent-watch", daemon=True).start()


def serve(ref: str, fd: int, path: list[str]) -> None:
    """The child: score every sample sent until the parent closes the connection."""
    _die_with_parent()
    sys.path.extend(entry for entry in path if entry not in sys.path)
    connection = Connection(fd)
    function = load_reward_function(ref)
    connection.send(READY)
    while True:
        try:
            batch = connection.recv()
        except (EOFError, OSError):
            return
        for completion, sample in batch:
            connection.send(score_safely(function, completion, sample))


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]))
