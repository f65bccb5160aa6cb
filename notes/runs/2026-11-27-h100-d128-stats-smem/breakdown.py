# ruff: noqa  (run record: the script as it ran on the GPU host, from the repository root)
import collections, statistics, sys, time
import torch
sys.path.insert(0, "src")
import triton
from triton.runtime.jit import JITFunction
from triton.experimental.gluon.nvidia import hopper
from triton.experimental.gluon import language as gl
from cs336sys.attention.flash_gluon import FlashAttentionGluon
from cs336sys.attention import flash_gluon_backward_ws as ws
acc = collections.defaultdict(float)
def wrap(obj, name, label):
    orig = getattr(obj, name)
    def inner(*a, **k):
        t = time.perf_counter(); r = orig(*a, **k); acc[label(a) if callable(label) else label] += time.perf_counter() - t; return r
    setattr(obj, name, inner)
wrap(JITFunction, "run", lambda a: "launch " + a[0].fn.__name__)
orig_init = hopper.TensorDescriptor.__init__
wrap(gl.NVMMASharedLayout, "get_default_for", "get_default_for")
wrap(ws, "flash_backward_gluon_ws", "flash_backward_gluon_ws (all)")
import cs336sys.attention.flash_gluon as fg
wrap(fg, "flash_attention_gluon_forward", "flash_attention_gluon_forward (all)")
shape = tuple(int(x) for x in sys.argv[1].split(","))
q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
def fn():
    FlashAttentionGluon.apply(q, k, v, True, "gluon").sum().backward()
for _ in range(5): fn()
torch.cuda.synchronize(); acc.clear()
n = 50; tot = 0
for _ in range(n):
    for t in (q, k, v): t.grad = None
    torch.cuda.synchronize(); t0 = time.perf_counter(); fn(); tot += time.perf_counter() - t0; torch.cuda.synchronize()
print(f"shape {shape}: host per fwd+bwd {tot / n * 1e3:.3f} ms")
for key, val in sorted(acc.items(), key=lambda kv: -kv[1]):
    print(f"  {val / n * 1e3:8.3f} ms  {key}")
# descriptors alone
x = torch.empty(16 * 16384, 64, device="cuda", dtype=torch.bfloat16)
lay = gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16)
t = time.perf_counter()
for _ in range(1000): hopper.TensorDescriptor(x, [16 * 16384, 64], [64, 1], [64, 64], lay)
print(f"  TensorDescriptor: {(time.perf_counter() - t):.3f} ms each (1000)")
t = time.perf_counter()
for _ in range(1000): gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16)
print(f"  get_default_for: {(time.perf_counter() - t):.3f} ms each (1000)")
t = time.perf_counter()
for _ in range(1000): torch.zeros((16 * 16384, 64), dtype=torch.float32, device="cuda")
torch.cuda.synchronize()
print(f"  torch.zeros: {(time.perf_counter() - t):.3f} ms each (1000)")
