"""Profiling and memory (problems 2, 5 and 6), and the trace timelines the DDP and FSDP work reuse.

- `annotate`: named ranges (record_function + NVTX) around step phases and inside attention, free
  when off.
- `trace`: a torch.profiler Chrome trace parsed once into host ranges and device work.
- `kernels`: kernel tables per range, matmul share, softmax vs matmul against their FLOPs.
- `timeline`: a compact per-stream summary of one step's device work, and its figure.
- `memory`: allocator-snapshot summaries (active-memory timeline, peak, largest allocations) and
  their figure.
- `saved_tensors`: bytes saved for backward per op, gradient bytes, residual-stream size.
- `checkpointing`: peak memory and step time over checkpoint group sizes, the sqrt(N) prediction.
"""
