"""cs336sys.leaderboard.offload: saved activations in host memory between forward and backward. On the CPU the
copies are synchronous: these tests check that gradients are exactly those without offloading, what is
copied and when it comes back; the GPU test checks that an offloaded block's activations leave the device."""

from __future__ import annotations

import pytest
import torch

from cs336sys.leaderboard.offload import HostOffload
from cs336sys.model import TransformerBlock


def blocks(seed: int, n: int = 4, device: str = "cpu") -> torch.nn.ModuleList:
    torch.manual_seed(seed)
    return torch.nn.ModuleList(TransformerBlock(32, 4, 64, 16, 10000.0, device=device) for _ in range(n))


def loss_and_grads(model, x, offload: HostOffload | None, offloaded=(), steps: int = 1):
    """Forward through the blocks (those in `offloaded` under the offload's hooks), backward; `steps` times."""
    for _ in range(steps):
        model.zero_grad()
        h = x
        for i, block in enumerate(model):
            if offload is not None and i in offloaded:
                with offload.group(i), torch.autograd.graph.saved_tensors_hooks(offload.pack, offload.unpack):
                    h = block(h)
            else:
                h = block(h)
        loss = h.square().mean()
        if offload is not None:
            offload.prefetch()
        loss.backward()
        if offload is not None:
            offload.reset()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def test_gradients_are_exactly_those_without_offloading():
    seed = int(torch.randint(0, 2**31 - 1, ()))
    x = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(seed))
    loss, grads = loss_and_grads(blocks(seed), x, None)
    offload = HostOffload(min_bytes=0)
    loss_off, grads_off = loss_and_grads(blocks(seed), x, offload, offloaded={0, 2})
    assert torch.equal(loss, loss_off)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_off, strict=True))
    assert offload.copies_to_host > 0 and offload.copies_to_device == offload.copies_to_host


def test_small_tensors_stay_and_a_tensor_saved_twice_is_copied_once():
    offload = HostOffload(min_bytes=1024)
    big, small = torch.randn(512, requires_grad=True), torch.randn(4, requires_grad=True)  # 2 KiB and 16 B
    with offload.group(0), torch.autograd.graph.saved_tensors_hooks(offload.pack, offload.unpack):
        y = (big * big).sum() + (small * small).sum()  # big saved twice by one product, small twice too
    assert offload.copies_to_host == 1
    y.backward()
    assert torch.equal(big.grad, 2 * big.detach()) and torch.equal(small.grad, 2 * small.detach())


def test_the_backward_fetches_each_group_before_the_one_it_needs_next():
    offload = HostOffload(min_bytes=0)
    x = torch.randn(2, 16, 32)
    loss_and_grads(blocks(1, n=5), x, offload, offloaded={0, 1, 3})
    # the end of the forward starts the highest; unpacking group i starts the next lower one
    assert offload.fetch_order == [3, 1, 0]


def test_a_second_step_reuses_the_host_buffers():
    offload = HostOffload(min_bytes=0)
    x = torch.randn(2, 16, 32)
    loss_and_grads(blocks(2), x, offload, offloaded={1, 2}, steps=1)
    first = offload.host_allocations
    held = offload.host_bytes()
    loss_and_grads(blocks(2), x, offload, offloaded={1, 2}, steps=2)
    assert first > 0 and offload.host_allocations == first and offload.host_bytes() == held


def test_a_handle_from_before_reset_or_a_group_filled_twice_is_an_error():
    offload = HostOffload(min_bytes=0)
    a = torch.randn(8, requires_grad=True)
    with offload.group(0), torch.autograd.graph.saved_tensors_hooks(offload.pack, offload.unpack):
        y = (a * a).sum()
    with pytest.raises(ValueError, match="group 0 was already filled"):
        with offload.group(0):
            pass
    offload.reset()
    with pytest.raises(RuntimeError, match="before the last reset"):
        y.backward()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none visible)")
def test_offloaded_activations_leave_the_gpu_and_the_gradients_match():
    seed = int(torch.randint(0, 2**31 - 1, ()))
    x = torch.randn(4, 16, 32, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
    _, grads = loss_and_grads(blocks(seed, device="cuda"), x, None)
    model = blocks(seed, device="cuda")
    offload = HostOffload(min_bytes=0)
    kept = torch.cuda.memory_allocated()
    h = x
    for i, block in enumerate(model):
        with offload.group(i), torch.autograd.graph.saved_tensors_hooks(offload.pack, offload.unpack):
            h = block(h)
    torch.cuda.synchronize()
    torch.empty(1, device="cuda")  # the allocator frees blocks a side stream used at its next call
    offloaded_forward = torch.cuda.memory_allocated() - kept
    h.square().mean().backward()
    offload.reset()
    plain = blocks(seed, device="cuda")
    kept = torch.cuda.memory_allocated()
    h2 = x
    for block in plain:
        h2 = block(h2)
    plain_forward = torch.cuda.memory_allocated() - kept
    assert offloaded_forward < plain_forward / 2
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads, strict=True))
