# ruff: noqa  (run record: the script as it ran on the GPU host, from the repository root)
"""Clock and power while each backward runs back to back (H100 power cap), at the 2025 shape."""
import statistics, subprocess, sys, threading, time
import torch
sys.path.insert(0, "src")
from cs336sys.attention.flash_gluon import flash_attention_gluon_backward, flash_attention_gluon_forward
from cs336sys.attention.bench import sdpa_attention, pick_sdpa_backend
smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active",
                        "--format=csv,noheader,nounits", "-lms", "100"], stdout=subprocess.PIPE, text=True, bufsize=1)
samples = []
threading.Thread(target=lambda: [samples.append((time.time(), l.strip())) for l in smi.stdout], daemon=True).start()
torch.manual_seed(0)
shape = (16, 16384, 64)
q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
do = torch.randn_like(q)
out, lse = flash_attention_gluon_forward(q.detach(), k.detach(), v.detach(), True)
q4 = lambda t: t.unsqueeze(1)
sdpa = sdpa_attention(pick_sdpa_backend(q4(q), True, "cudnn"))
o_c = sdpa(q4(q), q4(k), q4(v), True)
fns = {"ours": lambda: flash_attention_gluon_backward(q.detach(), k.detach(), v.detach(), out, lse, do, True),
       "cudnn": lambda: torch.autograd.grad(o_c, (q, k, v), do.unsqueeze(1), retain_graph=True)}
for f in fns.values():
    for _ in range(5): f()
torch.cuda.synchronize()
for rnd in range(2):
    for n, f in fns.items():
        time.sleep(2)  # cool down a little between phases
        t0 = time.time(); calls = 0
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        while time.time() < t0 + 4:
            for _ in range(10): f()
            calls += 10
            torch.cuda.synchronize()
        e.record(); torch.cuda.synchronize(); t1 = time.time()
        win = [l.split(", ") for t, l in samples if t0 + 1 < t < t1]
        clk = [float(w[0]) for w in win]; pw = [float(w[1]) for w in win]
        print(f"round {rnd} {n:6s}: {s.elapsed_time(e) / calls:.3f} ms a call over {calls} calls; "
              f"SM clock median {statistics.median(clk):.0f} MHz (min {min(clk):.0f}); power median {statistics.median(pw):.0f} W; "
              f"temperature {win[-1][2]} C; throttle {sorted(set(w[3] for w in win))}", flush=True)
smi.terminate()
