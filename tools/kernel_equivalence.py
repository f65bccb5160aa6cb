"""Do two versions of the flash kernels compile to the same machine code? Checked on a CPU machine.

    python tools/kernel_equivalence.py REV            # REV's sources against this checkout's
    python tools/kernel_equivalence.py REV --list     # also each launch's hash

A refactor of the Triton kernels (a helper pulled out, shared setup written once) changes their
source, so the re-run rule stales every result they made, though the GPU may run the same code.
This runs each version's launchers (`flash_forward`, `flash_backward`) on CPU tensors with the
launches caught instead of run, at the tile table's configurations for the committed shapes (the
flash grid's d in {16, 32, 64, 128}, both leaderboard shapes; bf16, fp16, fp32 with tf32 and IEEE
products; causal and not; even and ragged lengths), compiles each caught launch with Triton for
sm_90, and compares the PTX with its line and file records removed. Same PTX for every launch
means the same kernels under this Triton (the GPU hosts run another version: say so where it is
used as evidence). Exit status 0 when every launch matches, 1 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# (batch, heads, seq_q, seq_k, d): the flash grid's head dims, both leaderboard shapes' tile choices
# (many programs per SM: the 2025 shape's 16 x 16384 rows; one head at 32768), ragged lengths
CASES = [(1, 1, 256, 256, 16), (1, 1, 256, 256, 32), (1, 1, 256, 256, 64), (1, 1, 256, 256, 128),
         (1, 1, 200, 200, 64), (1, 1, 200, 328, 128), (16, 1, 16384, 16384, 64), (1, 32, 32768, 32768, 128)]


def _worker() -> None:
    """In a process whose path holds one version's sources: print {launch key: PTX hash} as JSON."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from cs336sys.attention import flash_configs, flash_triton_backward, flash_triton_forward

    caught = []

    def catch(kernel):
        def run(*args, grid, warmup, **kwargs):
            caught.append((kernel, args, kwargs))
        kernel.run = run

    for module in (flash_triton_forward, flash_triton_backward):
        for value in vars(module).values():
            if isinstance(value, triton.runtime.jit.JITFunction) and value.__module__ == module.__name__:
                catch(value)

    def meta(shape, dtype):  # only shapes and dtypes matter to a caught launch: allocate nothing
        return torch.empty(shape, dtype=dtype, device="meta")

    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for precision in (("tf32", "ieee") if dtype == torch.float32 else ("tf32",)):
            for b, h, sq, sk, d in CASES:
                if dtype == torch.float32 and sq > 4096:
                    continue  # the fp32 grid stops well short of the leaderboard shapes
                lead = [b, h] if h > 1 else [b]
                q, k, v = meta(lead + [sq, d], dtype), meta(lead + [sk, d], dtype), meta(lead + [sk, d], dtype)
                lse = meta(lead + [sq], torch.float32)
                for causal in ((False, True) if sq == sk else (False,)):
                    fwd = flash_configs.forward_config(d, dtype, sq, b * h, True)
                    bwd = flash_configs.backward_config(d, dtype, sk, b * h, True)
                    flash_triton_forward.flash_forward(q, k, v, causal, fwd, precision)
                    flash_triton_backward.flash_backward(q, k, v, q, lse, q, causal, bwd, precision)

    def arg_type(x):
        if isinstance(x, torch.Tensor):
            return "*" + {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[x.dtype]
        if isinstance(x, bool):
            return "i1"
        return "i32" if isinstance(x, int) else "fp32"

    seen, out = set(), {}
    for kernel, args, kwargs in caught:
        options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
        names = kernel.arg_names
        constexprs = dict(kwargs)
        for param in kernel.params:  # constexprs the launch left at their defaults
            if param.is_constexpr and param.name not in constexprs and param.has_default:
                constexprs[param.name] = param.default
        signature = {n: arg_type(a) for n, a in zip(names, args, strict=False)}
        signature.update({n: "constexpr" for n in constexprs})
        key = json.dumps([kernel.__name__, signature, {k: str(v) for k, v in constexprs.items()}, options],
                         sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
        ptx = compiled.asm["ptx"]
        ptx = ptx.split("\t.section\t.debug")[0]
        ptx = "\n".join(line for line in ptx.splitlines() if not re.match(r"\s*\.(loc|file)\b", line))
        out[key] = hashlib.sha256(ptx.encode()).hexdigest()[:16]
    print(json.dumps(out))


def _hashes(src: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(src), "TRITON_DEFAULT_FP_FUSION": "1"}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, __file__, "--worker"], env=env, capture_output=True, text=True,
                          timeout=3000)
    if done.returncode != 0:
        raise SystemExit(f"compiling the kernels of {src} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("rev", nargs="?", help="the git revision to compare this checkout's kernels with")
    p.add_argument("--list", action="store_true", help="print every launch and its PTX hash")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        _worker()
        return 0
    if not args.rev:
        p.error("name a revision")
    with tempfile.TemporaryDirectory(prefix="kernels-") as tmp:
        archive = subprocess.run(["git", "archive", args.rev, "src"], cwd=REPO, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        before = _hashes(Path(tmp) / "src")
    after = _hashes(REPO / "src")
    differ = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    for key in sorted(after) if args.list else []:
        print(after[key], key)
    print(f"{len(after)} launches compiled for sm_90 (Triton {_triton_version()}): "
          + ("the same PTX in both versions" if not differ else f"{len(differ)} differ"))
    for key in differ:
        print(f"  differs: {key} ({before.get(key)} -> {after.get(key)})")
    return 1 if differ else 0


def _triton_version() -> str:
    import triton

    return triton.__version__


if __name__ == "__main__":
    sys.exit(main())
