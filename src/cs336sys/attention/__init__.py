"""Attention kernels: naive PyTorch, FlashAttention-2 in PyTorch and in Triton (problems 7-11).

    cs336sys.attention.naive          naive_attention(q, k, v, is_causal); the model's default backend
    cs336sys.attention.flash_pytorch  FlashAttention2PyTorch.apply(q, k, v, is_causal)
    cs336sys.attention.flash_triton   FlashAttention2Triton.apply(q, k, v, is_causal)

This package file imports nothing, so that a module using one implementation (the model uses the
naive one) is not tied, in its code hash or its imports, to the others; Triton in particular is
imported only by the modules that launch its kernels.
"""
