# ruff: noqa  (run record: the script as it ran on the GPU host, from the repository root)
import statistics, sys
import torch
sys.path.insert(0, "src")
import triton
from torch.profiler import profile, ProfilerActivity
from cs336sys.attention.flash_gluon import FlashAttentionGluon
from cs336sys.attention.bench import sdpa_attention, pick_sdpa_backend
torch.manual_seed(0)
shape = (16, 16384, 64)
q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
q4 = lambda t: t.unsqueeze(1)
sdpa = sdpa_attention(pick_sdpa_backend(q4(q), True, "cudnn"))
impls = {"gluon_bwd": lambda: FlashAttentionGluon.apply(q, k, v, True, "gluon"),
         "cudnn": lambda: sdpa(q4(q), q4(k), q4(v), True)}
cache = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int, device="cuda")
for name, attend in impls.items():
    fn = lambda: attend().sum().backward()
    for _ in range(10): fn()
    torch.cuda.synchronize()
    ms = triton.testing.do_bench(fn, grad_to_none=[q, k, v], return_mode="median", rep=300)
    starts, ends = [torch.cuda.Event(enable_timing=True) for _ in range(20)], [torch.cuda.Event(enable_timing=True) for _ in range(20)]
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(20):
            for t in (q, k, v): t.grad = None
            cache.zero_()
            starts[i].record(); fn(); ends[i].record()
        torch.cuda.synchronize()
    ev = sorted([e for e in prof.events() if e.device_type.name == "CUDA" and e.name != "Memset"], key=lambda e: e.time_range.start)
    # group: each rep starts after a zero_ (FillFunctor<int>)
    reps, cur = [], None
    for e in ev:
        if "FillFunctor<int>" in e.name:
            cur = []; reps.append(cur); continue
        if cur is not None: cur.append(e)
    spans, busy, gaps = [], [], []
    for r in reps[2:]:
        s = r[0].time_range.start; t = r[-1].time_range.end
        spans.append((t - s) / 1e3); busy.append(sum(e.time_range.end - e.time_range.start for e in r) / 1e3)
        for a, b in zip(r, r[1:]):
            g = (b.time_range.start - a.time_range.end) / 1e3
            if g > 0.01: gaps.append((round(g, 3), a.name[:40], b.name[:40]))
    ev_ms = statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))
    print(f"{name}: do_bench {ms:.3f} ms; events {ev_ms:.3f}; kernel span {statistics.median(spans):.3f}; busy {statistics.median(busy):.3f}")
    for g in sorted(gaps, reverse=True)[:8]: print("   gap", g)
    print("   kernels of one rep:", [(e.name[:30], round((e.time_range.end - e.time_range.start) / 1e3, 3)) for e in reps[5]])
