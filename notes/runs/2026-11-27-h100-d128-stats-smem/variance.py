# ruff: noqa  (run record: the script as it ran on the GPU host, from the repository root)
"""Per-call times of our d 64 backward and cuDNN's at the 2025 shape, interleaved, each after an L2
clear; with the dQ workspace fresh each call (as the launcher does) or one buffer reused."""
import statistics, subprocess, sys, time
import torch
sys.path.insert(0, "src")
from cs336sys.attention import flash_gluon_backward_ws as ws
from cs336sys.attention.flash_gluon import FlashAttentionGluon, flash_attention_gluon_backward, flash_attention_gluon_forward
from cs336sys.attention.bench import sdpa_attention, pick_sdpa_backend
smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active",
                        "--format=csv,noheader", "-lms", "200"], stdout=subprocess.PIPE, text=True)
torch.manual_seed(0)
shape = (16, 16384, 64)
q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
do = torch.randn_like(q)
out, lse = flash_attention_gluon_forward(q.detach(), k.detach(), v.detach(), True)
q4 = lambda t: t.unsqueeze(1)
sdpa = sdpa_attention(pick_sdpa_backend(q4(q), True, "cudnn"))
o_c = sdpa(q4(q), q4(k), q4(v), True)
cache = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int, device="cuda")
real_zeros = torch.zeros
held = {}
def reused_zeros(*a, **kw):
    key = (tuple(a[0]) if isinstance(a[0], (tuple, list)) else a, kw.get("dtype"))
    if key not in held: held[key] = real_zeros(*a, **kw)
    return held[key].zero_()
def ours():
    flash_attention_gluon_backward(q.detach(), k.detach(), v.detach(), out, lse, do, True)
def ours_reused():
    orig = torch.zeros; torch.zeros = reused_zeros
    try: ours()
    finally: torch.zeros = orig
def cudnn():
    torch.autograd.grad(o_c, (q, k, v), do.unsqueeze(1), retain_graph=True)
fns = {"ours (fresh dQ workspace)": ours, "ours (one workspace reused)": ours_reused, "cudnn": cudnn}
for f in fns.values():
    for _ in range(5): f()
torch.cuda.synchronize()
times = {n: [] for n in fns}
t_start = time.time()
for rnd in range(int(sys.argv[1]) if len(sys.argv) > 1 else 60):
    for n, f in fns.items():
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cache.zero_(); s.record(); f(); e.record(); torch.cuda.synchronize()
        times[n].append(s.elapsed_time(e))
print(f"{torch.cuda.get_device_name()}, {time.time() - t_start:.1f} s")
for n, t in times.items():
    q_ = statistics.quantiles(t, n=10)
    print(f"{n:30s} median {statistics.median(t):.3f}  min {min(t):.3f}  p10 {q_[0]:.3f}  p90 {q_[-1]:.3f}  max {max(t):.3f}")
    print("    first 30:", " ".join(f"{x:.2f}" for x in t[:30]))
# sustained: 3 s of back-to-back calls each, no sync between, then the per-call median of the last 20
for n, f in fns.items():
    end = time.time() + 3
    while time.time() < end:
        for _ in range(20): f()
        torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(20)]
    for s, e in ev: s.record(); f(); e.record()
    torch.cuda.synchronize()
    print(f"sustained {n:30s} median {statistics.median(s.elapsed_time(e) for s, e in ev):.3f}")
smi.terminate(); lines = smi.stdout.read().splitlines()
print("nvidia-smi samples:", len(lines)); print("\n".join(lines[:: max(1, len(lines) // 25)]))
