"""Saved activations kept in host memory between the forward and the backward, copied beside compute.

A block that is not checkpointed keeps what its backward needs (about 4 GB a block in the 8B step) on the
GPU from its forward to its backward; a checkpointed one keeps its input and recomputes the rest (about
18 ms a block). `HostOffload` is a third way: the block's saved tensors go to pinned host memory as the
forward makes them (device-to-host copies on a stream of their own) and come back, a block ahead of the
backward that needs them, on another. The GPU memory a block's activations held is free for the rest of
the forward, so more blocks can skip their recomputation within the same peak. Whether that pays is a
matter of the host link: a block's 4 GB take about 80 ms each way at 50 GB/s, to be hidden under the
forward's and the backward's compute.

Use: `pack` and `unpack` are saved-tensor hooks (torch.autograd.graph.saved_tensors_hooks), composable
with other hooks (what `pack` is given and does not take it returns unchanged, and `unpack` returns what is
not its own); `group(i)` marks the tensors saved inside it as group i's (one group a block: the backward
runs the groups in reverse, and unpacking one of group i starts the copy back of the next lower group);
`reset()` after each step's backward returns the host buffers to a pool the next step reuses. Small
tensors (under `min_bytes`) stay where they are. Without CUDA every copy is synchronous (the tests check
the bookkeeping and the gradients on the CPU).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class _Saved:
    """What autograd keeps for an offloaded tensor: its group, its slot in the group, and the step it was saved in."""

    group: int
    slot: int
    step: int


@dataclass
class _Group:
    host: list[Tensor] = field(default_factory=list)  # the copies, in slot order
    devices: list[torch.device] = field(default_factory=list)
    # while the group's forward runs: a tensor saved twice is copied once (held, so that its memory is not
    # reused by another tensor of the same layout before the group ends)
    seen: dict[tuple, tuple[int, Tensor]] = field(default_factory=dict)
    handles: list[int] = field(default_factory=list)  # per slot: saved handles not yet unpacked
    back: list[Tensor | None] | None = None  # on the device again, once fetched (None: all unpacked)
    ready: torch.cuda.Event | None = None  # the copies back are done (CUDA)


class HostOffload:
    """Saved tensors of marked groups moved to (pinned) host memory and back; see the module's docstring."""

    def __init__(self, min_bytes: int = 1 << 20):
        self.min_bytes = min_bytes
        self.cuda = torch.cuda.is_available()
        self._to_host = torch.cuda.Stream() if self.cuda else None
        self._to_device = torch.cuda.Stream() if self.cuda else None
        self._groups: dict[int, _Group] = {}
        self._current: int | None = None
        self._pool: dict[tuple[tuple[int, ...], tuple[int, ...], torch.dtype], list[Tensor]] = {}
        self._step = 0
        self.copies_to_host = 0  # counters, for tests and the step's record
        self.copies_to_device = 0
        self.host_allocations = 0
        self.fetch_order: list[int] = []

    @contextlib.contextmanager
    def group(self, index: int) -> Iterator[None]:
        """Tensors saved inside this context belong to group `index` (one group a block)."""
        if index in self._groups:
            raise ValueError(f"group {index} was already filled this step (call reset() after each backward)")
        self._groups[index] = _Group()
        previous, self._current = self._current, index
        try:
            yield
        finally:
            self._current = previous
            self._groups[index].seen.clear()

    def pack(self, t: Tensor) -> object:
        if self._current is None or not isinstance(t, Tensor) or t.numel() * t.element_size() < self.min_bytes:
            return t
        g = self._groups[self._current]
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype,
               t._version)
        if key in g.seen:
            slot = g.seen[key][0]
            g.handles[slot] += 1
            return _Saved(self._current, slot, self._step)
        host = self._host_buffer(tuple(t.shape), t.stride(), t.dtype)  # its layout too: the backward's kernels
        # may depend on it (a transposed operand), and the gradients must be exactly those without offloading
        if self.cuda and t.is_cuda:
            self._to_host.wait_stream(torch.cuda.current_stream(t.device))
            with torch.cuda.stream(self._to_host):
                host.copy_(t, non_blocking=True)
            t.record_stream(self._to_host)  # its memory is not reused before the copy has read it
        else:
            host.copy_(t)
        self.copies_to_host += 1
        g.seen[key] = (len(g.host), t)
        g.handles.append(1)
        g.host.append(host)
        g.devices.append(t.device)
        return _Saved(self._current, len(g.host) - 1, self._step)

    def unpack(self, saved: object) -> Tensor:
        if not isinstance(saved, _Saved):
            return saved  # type: ignore[return-value]
        if saved.step != self._step:
            raise RuntimeError("a tensor saved before the last reset() was unpacked: reset() only after the backward")
        g = self._groups[saved.group]
        if g.back is None:
            self._fetch(saved.group)
        lower = [i for i in self._groups if i < saved.group and self._groups[i].back is None]
        if lower:  # the backward reaches the next lower group next: start its copies now
            self._fetch(max(lower))
        t = g.back[saved.slot]
        if t is None or g.handles[saved.slot] == 0:
            raise RuntimeError(f"group {saved.group}, slot {saved.slot} unpacked more often than saved "
                               "(a backward with retain_graph=True is not supported)")
        if g.ready is not None:
            stream = torch.cuda.current_stream(t.device)
            stream.wait_event(g.ready)
            t.record_stream(stream)
        g.handles[saved.slot] -= 1
        if g.handles[saved.slot] == 0:
            g.back[saved.slot] = None  # the backward holds it now; its memory goes when it is done with it
        return t

    def prefetch(self) -> None:
        """Start the copies back of the highest group not fetched yet: call it at the end of the forward, so
        the backward's first offloaded block does not wait for its whole copy."""
        waiting = [i for i, g in self._groups.items() if g.back is None]
        if waiting:
            self._fetch(max(waiting))

    def reset(self) -> None:
        """After the step's backward: every group's host buffers back to the pool, for the next step."""
        if self.cuda:
            self._to_device.synchronize()  # the copies back have read the buffers
        for g in self._groups.values():
            for host in g.host:
                self._pool.setdefault((tuple(host.shape), host.stride(), host.dtype), []).append(host)
        self._groups.clear()
        self._step += 1

    def host_bytes(self) -> int:
        """Bytes of host memory held (buffers in use and pooled)."""
        in_use = [h for g in self._groups.values() for h in g.host]
        pooled = [h for hs in self._pool.values() for h in hs]
        return sum(h.numel() * h.element_size() for h in in_use + pooled)

    def _host_buffer(self, shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        free = self._pool.get((shape, stride, dtype))
        if free:
            return free.pop()
        self.host_allocations += 1
        return torch.empty_strided(shape, stride, dtype=dtype, device="cpu", pin_memory=self.cuda)

    def _fetch(self, index: int) -> None:
        g = self._groups[index]
        self.fetch_order.append(index)
        on_gpu = self.cuda and any(d.type == "cuda" for d in g.devices)
        if on_gpu:
            self._to_device.wait_stream(self._to_host)  # the copies out of the device are complete
        with torch.cuda.stream(self._to_device) if on_gpu else contextlib.nullcontext():
            g.back = [torch.empty_strided(host.shape, host.stride(), dtype=host.dtype, device=device)
                      .copy_(host, non_blocking=on_gpu) for host, device in zip(g.host, g.devices, strict=True)]
            if on_gpu:
                g.ready = torch.cuda.Event()
                g.ready.record(self._to_device)
        self.copies_to_device += len(g.host)
