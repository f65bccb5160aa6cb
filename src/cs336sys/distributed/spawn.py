"""Run a function on N ranks in new processes (gloo on the CPU, or NCCL), for tests and tools.

    results = spawn(worker, 2, x, y)          # worker(info: RankInfo, x, y) on ranks 0 and 1

Each rank joins a process group (with a timeout) before `worker` runs and leaves it afterwards.
The call returns every rank's return value, in rank order. If a rank raises, or dies without a
word, the other ranks are stopped at once and `RankFailed` names that rank and carries its error
and traceback; if the whole run passes `timeout_s`, every rank is stopped and `RankFailed` says
which ranks had not finished. Nothing is left running and nothing waits forever.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import socket
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

from cs336sys.distributed import process_group


class RankFailed(RuntimeError):
    """A rank of a spawned or launched group raised, died or did not finish in time."""

    def __init__(self, rank: int | None, message: str, remote_traceback: str = ""):
        self.rank = rank
        self.remote_traceback = remote_traceback
        where = f"rank {rank}" if rank is not None else "the process group"
        super().__init__(f"{where}: {message}" + (f"\n--- traceback of rank {rank} ---\n{remote_traceback}"
                                                  if remote_traceback else ""))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Ranks are forked from a fork server that has imported torch already: a fresh interpreter per rank spends
# about 2 s of CPU importing it, which the tests' many small rank groups paid again and again. The server is
# itself a fresh interpreter (never a fork of the caller: no CUDA or thread state is inherited), and each
# rank takes the caller's environment as it is at the call, not the one the server started with.
PRELOAD = ["torch", "torch.distributed"]


def _context() -> multiprocessing.context.BaseContext:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def _rank_main(fn: Callable, rank: int, world_size: int, port: int, device: str, pg_timeout_s: float,
               conn: Connection, args: tuple, env: dict[str, str]) -> None:
    os.environ.clear()
    os.environ.update(env, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch

    torch.set_num_threads(1)  # N ranks share the machine's cores
    try:
        info = process_group.init(device, timeout=pg_timeout_s)
        # Plain pickle, not multiprocessing's: torch's reducer would share a returned tensor's memory
        # through this process, which is gone by the time the parent reads it.
        conn.send_bytes(pickle.dumps(("ok", fn(info, *args))))
    except BaseException as exc:  # report everything, KeyboardInterrupt included
        conn.send_bytes(pickle.dumps(("error", f"{type(exc).__name__}: {exc}", traceback.format_exc())))
    finally:
        conn.close()
        process_group.destroy()


def _stop(procs: list) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 5
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def spawn(fn: Callable[..., Any], world_size: int, *args: Any, device: str = "cpu", timeout_s: float = 300.0,
          pg_timeout_s: float = 60.0) -> list[Any]:
    """Run `fn(info, *args)` on `world_size` ranks; return their results in rank order.

    `fn` and `args` must be picklable (a module-level function). `pg_timeout_s` bounds each
    collective, `timeout_s` the whole run.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    ctx = _context()
    port = free_port()
    procs, conns = [], []
    env = dict(os.environ)
    for rank in range(world_size):
        recv, send = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_rank_main, args=(fn, rank, world_size, port, device, pg_timeout_s, send, args, env),
                        name=f"rank{rank}", daemon=True)
        p.start()
        send.close()
        procs.append(p)
        conns.append(recv)
    results: dict[int, Any] = {}
    failures: list[tuple[int, str, str]] = []  # (rank, message, traceback) in the order seen
    waiting = dict(enumerate(conns))
    deadline = time.monotonic() + timeout_s
    settle = None  # after the first failure, a moment for its cause to show itself
    try:
        while waiting:
            now = time.monotonic()
            if settle is not None and now >= settle:
                break
            if now >= deadline:
                raise RankFailed(None, f"ranks {sorted(waiting)} did not finish within {timeout_s:g} s")
            left = min(deadline, settle or deadline) - now
            ready = wait(list(waiting.values()) + [procs[r].sentinel for r in waiting], timeout=left)
            for rank, conn in list(waiting.items()):
                if conn not in ready and procs[rank].sentinel not in ready:
                    continue
                try:
                    message = pickle.loads(conn.recv_bytes())
                except EOFError:  # exited (or was killed) without a word
                    procs[rank].join(5)
                    failures.append((rank, f"died with exit code {procs[rank].exitcode} before reporting a result",
                                     ""))
                else:
                    if message[0] == "error":
                        failures.append((rank, message[1], message[2]))
                    else:
                        results[rank] = message[1]
                del waiting[rank]
                if failures and settle is None:
                    settle = time.monotonic() + 1.0
        if failures:
            # A rank that died silently is the likely cause of its peers' connection errors;
            # otherwise the first error reported.
            silent = [f for f in failures if not f[2]]
            raise RankFailed(*(silent or failures)[0])
        for p in procs:
            p.join(30)
    finally:
        _stop(procs)
        for c in conns:
            c.close()
    return [results[r] for r in range(world_size)]
