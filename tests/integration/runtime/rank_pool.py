"""Processes that play the ranks of one torch.distributed job after another, started once per test session.

The FSDP2 tests (equivalence, offload, token micro-batches, checkpoint resume) each run a function as ranks
0..world-1 of a gloo process group. `torch.multiprocessing.spawn` starts fresh processes for every such
run, and each fresh process spends seconds importing torch, transformers and kuberl (more on a busy
machine); the session ran about ten spawns. A `RankPool` starts its processes once and hands each job to
the first `world` of them; a job's function still sets up and tears down its own process group (a fresh
rendezvous file each time), exactly as under `mp.spawn`, so a test's ranks share nothing with the last
test's but the imported modules, `torch.set_num_threads(1)` and DTensor's caches of the last test's device
meshes. Those are right for the next test only because a process plays the same rank number in every job
(runtime/engines/fsdp.py `forget_sharding_caches` says what goes wrong at another rank).

`run` sends the parent's environment with each job, since some tests set variables for their ranks after the
pool started (test_checkpoint_s3.py: the AWS_* variables of its S3 server). A failed rank, one that died or
a job that outlasts its timeout ends every process of the pool (the other ranks may be stuck in a collective
waiting for it) and raises; the next job starts fresh processes.
"""

import multiprocessing
import os
import queue
import time
import traceback
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import Any

#: How long a job's ranks may take before the pool gives up on them (a hang, not a slow machine).
JOB_TIMEOUT_S = 600.0


def _serve(rank: int, inbox: Any, outbox: Any) -> None:
    """A rank's loop: run each job's function as `fn(rank, *args)` under the job's environment; report."""
    while (job := inbox.get()) is not None:
        function, args, environment = job
        os.environ.clear()
        os.environ.update(environment)
        try:
            function(rank, *args)
            outbox.put((rank, None))
        except BaseException:
            outbox.put((rank, traceback.format_exc()))
    os._exit(0)  # the interpreter's teardown takes seconds with torch loaded, and there is nothing to flush


class RankPool:
    """Up to as many processes as the largest job asked for, each serving one rank number for good."""

    def __init__(self) -> None:
        self._context = multiprocessing.get_context("spawn")
        self._outbox = self._context.Queue()
        self._ranks: list[tuple[BaseProcess, Any]] = []  # (process, its inbox), rank i at index i

    def run(self, function: Callable[..., None], world: int, *args: Any, timeout_s: float = JOB_TIMEOUT_S) -> None:
        """Runs `function(rank, *args)` on ranks 0..world-1 at once and waits for all of them (as
        `mp.spawn(function, args, nprocs=world, join=True)` does); raises with a failed rank's traceback."""
        while len(self._ranks) < world:
            inbox = self._context.Queue()
            process = self._context.Process(target=_serve, args=(len(self._ranks), inbox, self._outbox), daemon=True)
            process.start()
            self._ranks.append((process, inbox))
        environment = dict(os.environ)
        for _, inbox in self._ranks[:world]:
            inbox.put((function, args, environment))
        pending = set(range(world))
        deadline = time.monotonic() + timeout_s
        while pending:
            try:
                rank, error = self._outbox.get(timeout=1.0)
            except queue.Empty:
                dead = [rank for rank in pending if not self._ranks[rank][0].is_alive()]
                if dead or time.monotonic() > deadline:
                    self.close(kill=True)
                    what = f"rank {dead[0]} died" if dead else f"ranks {sorted(pending)} ran past {timeout_s:g} s"
                    raise RuntimeError(f"{function.__qualname__}: {what}") from None
                continue
            pending.discard(rank)
            if error is not None:
                self.close(kill=True)
                raise RuntimeError(f"{function.__qualname__} failed on rank {rank}:\n{error}")

    def close(self, kill: bool = False) -> None:
        """Ends every process: each leaves its loop, or with `kill` (after a failed job, whose other ranks may
        wait in a collective for ever) is killed. Results a killed job may still have sent are dropped with the
        queue they went to."""
        for process, inbox in self._ranks:
            if kill:
                process.kill()
            else:
                inbox.put(None)
        for process, _ in self._ranks:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join()
        self._ranks = []
        self._outbox = self._context.Queue()
