"""The 2026 leaderboard step (SPEC problem 25): a full 8B training step on two GPUs, built from our
parts (block-wise FSDP with bf16 compute and fp32 master shards, our Triton FlashAttention-2, an
LM head fused with the cross-entropy, a fused AdamW), and the same step from PyTorch's own parts
(FSDP2, SDPA, torch's fused AdamW) as the baseline timed in the same job.
"""
