"""A ring of N virtual devices running the handout's collectives step by step on real arrays.

Each step, every device sends one message to its right-hand neighbour; all messages of a step are
computed from the state before the step, then delivered (the devices act simultaneously). The trace
records every message (step, sender, receiver, bytes), so tests can compare the bytes per link per
step and the number of steps with `cs336sys.accounting.communication`, and the arrays each device
ends with against the true sum. Device i's tensor is split into N chunks with `numpy.array_split`
(equal when N divides its length).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Message:
    step: int
    src: int
    dst: int
    nbytes: int


@dataclass
class Trace:
    n: int
    messages: list[Message] = field(default_factory=list)
    steps: int = 0

    def send(self, step: int, src: int, payload: np.ndarray) -> None:
        self.messages.append(Message(step, src, (src + 1) % self.n, payload.nbytes))
        self.steps = max(self.steps, step)

    def bytes_per_link_per_step(self) -> dict[tuple[int, int, int], int]:
        """{(step, src, dst): bytes}."""
        out: dict[tuple[int, int, int], int] = {}
        for m in self.messages:
            out[m.step, m.src, m.dst] = out.get((m.step, m.src, m.dst), 0) + m.nbytes
        return out

    def bytes_sent(self, device: int) -> int:
        return sum(m.nbytes for m in self.messages if m.src == device)

    def time(self, bandwidth: float) -> float:
        """Seconds at `bandwidth` bytes/s of egress per device: a step ends when its largest message has gone."""
        per_step: dict[int, int] = {}
        for m in self.messages:
            per_step[m.step] = max(per_step.get(m.step, 0), m.nbytes)
        return sum(per_step.values()) / bandwidth


def _chunks(x: np.ndarray, n: int) -> list[np.ndarray]:
    return [c.copy() for c in np.array_split(x, n)]


def reduce_scatter(xs: list[np.ndarray], trace: Trace | None = None, first_step: int = 1) -> tuple[list, Trace]:
    """Ring reduce-scatter (handout 8.1): device i ends with chunk i of the sum. Returns every device's
    partial-sum chunks (chunk i of device i is complete) and the trace."""
    n = len(xs)
    trace = trace or Trace(n)
    y = [_chunks(x, n) for x in xs]  # y[i][c]: device i's partial sum of chunk c
    for t in range(1, n):
        # Device i sends chunk (i - t) mod n; its right neighbour adds it into its own copy.
        sent = [(i, (i - t) % n, y[i][(i - t) % n].copy()) for i in range(n)]
        for i, c, payload in sent:
            trace.send(first_step + t - 1, i, payload)
            y[(i + 1) % n][c] += payload
    return y, trace


def all_gather(chunks: list[np.ndarray], trace: Trace | None = None, first_step: int = 1) -> tuple[list, Trace]:
    """Ring all-gather: device i starts with chunk i, every device ends with all n chunks concatenated."""
    n = len(chunks)
    trace = trace or Trace(n)
    have = [{i: chunks[i].copy()} for i in range(n)]
    for t in range(1, n):
        # Device i forwards chunk (i - t + 1) mod n: its own at t = 1, then the one it last received.
        sent = [(i, (i - t + 1) % n, have[i][(i - t + 1) % n]) for i in range(n)]
        for i, c, payload in sent:
            trace.send(first_step + t - 1, i, payload)
            have[(i + 1) % n][c] = payload.copy()
    return [np.concatenate([h[c] for c in range(n)]) for h in have], trace


def ring_all_reduce(xs: list[np.ndarray]) -> tuple[list[np.ndarray], Trace]:
    """Reduce-scatter then all-gather: 2(n - 1) steps of one chunk per device."""
    n = len(xs)
    partial, trace = reduce_scatter(xs)
    return all_gather([partial[i][i] for i in range(n)], trace, first_step=n)


def alternate_all_reduce(xs: list[np.ndarray]) -> tuple[list[np.ndarray], Trace]:
    """The handout's alternate all-reduce: at step t device i sends the whole x^((i - t + 1) mod n) it
    holds (its own first, then the one it received last), receives x^((i - t) mod n) and adds it in."""
    n = len(xs)
    trace = Trace(n)
    y = [x.copy() for x in xs]
    held = [{i: xs[i].copy()} for i in range(n)]
    for t in range(1, n):
        sent = [(i, (i - t + 1) % n, held[i][(i - t + 1) % n]) for i in range(n)]
        for i, src_rank, payload in sent:
            trace.send(t, i, payload)
            receiver = (i + 1) % n
            held[receiver][src_rank] = payload.copy()
            y[receiver] += payload
    return y, trace
