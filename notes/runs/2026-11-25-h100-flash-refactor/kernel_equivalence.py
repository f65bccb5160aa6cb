"""Do two versions of the flash kernels compile to the same machine code? Checked on a CPU machine.

    python notes/runs/2026-11-25-h100-flash-refactor/kernel_equivalence.py REV            # REV's sources against this checkout's
    python notes/runs/2026-11-25-h100-flash-refactor/kernel_equivalence.py REV --list     # also each launch's hashes
    python notes/runs/2026-11-25-h100-flash-refactor/kernel_equivalence.py REV --strict   # the SASS must match too

A refactor of the Triton kernels (a helper pulled out, shared setup written once) changes their
source, so the re-run rule stales every result they made, though the GPU may run the same code.
This runs each version's launchers on CPU tensors with the launches caught instead of run, compiles
each caught launch with Triton for sm_90, and compares the PTX with its line and file records
(and the labels that mark them) removed, and the machine code that ptxas made of it (SASS, by
Triton's own nvdisasm). The launches:
  - the pointer kernels (`flash_forward`, `flash_backward`) at the tile table's configurations for
    the committed shapes (the flash grid's d in {16, 32, 64, 128}, both leaderboard shapes; bf16,
    fp16, fp32 with tf32 and IEEE products; causal and not; even and ragged lengths);
  - the descriptor (TMA) kernels of `flash_triton_tma`, which run in bf16: `TmaConfig()` with and
    without prefetch at the same shapes, and every candidate of notes/runs/2026-11-24-h100/flash_hopper_probe.py (its
    tile tables and its warp-specialisation evidence) at both leaderboard shapes. Descriptors need
    no GPU to compile: the PTX holds the TMA copies. The backward kernels with warp_specialize stop
    the compiler (its warp-specialisation pass fails); such a launch counts as the same when it
    fails in both versions, and the summary says how many did.
The same PTX for every launch means the same instructions in the same order under this Triton
(the GPU hosts run another version: say so where it is used as evidence). It is not yet the same
machine code: every inlined helper call leaves labels in the PTX for its debug line records, no
instruction refers to them, but ptxas (seen with Triton 3.6 and 3.9) schedules around them,
so a helper pulled out can change its schedule and registers. The SASS line says for how many
launches it did. Exit status 0 when every launch has the same PTX (with --strict: and the same
SASS), 1 otherwise.

A record of the 2026-11-25 refactor (it ran as tools/kernel_equivalence.py): the descriptor kernels it
compiles (`flash_triton_tma`) left the package after commit 1a6ada3, so run it from a checkout that has them.
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

REPO = Path(__file__).resolve().parents[3]  # the checkout (this record lies in notes/runs/<run>/)
FAILS = "does not compile:"
# Line records, and the labels that mark where an inlined helper's lines begin for the (removed)
# debug sections: no instruction refers to them, and a helper call adds some.
DEBUG_LINE = re.compile(r"\s*(\.(loc|file)\b|\$L__tmp\d+:$)")

# (batch, heads, seq_q, seq_k, d): the flash grid's head dims, both leaderboard shapes' tile choices
# (many programs per SM: the 2025 shape's 16 x 16384 rows; one head at 32768), ragged lengths
CASES = [(1, 1, 256, 256, 16), (1, 1, 256, 256, 32), (1, 1, 256, 256, 64), (1, 1, 256, 256, 128),
         (1, 1, 200, 200, 64), (1, 1, 200, 328, 128), (16, 1, 16384, 16384, 64), (1, 32, 32768, 32768, 128)]


def _worker() -> None:
    """In a process whose path holds one version's sources: print {launch key: PTX hash} as JSON."""
    import torch
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import mangle_type

    from cs336sys.attention import flash_configs, flash_triton_backward, flash_triton_forward
    from cs336sys.attention import flash_triton_tma as tma

    sys.path.insert(0, str(REPO / "notes" / "runs" / "2026-11-24-h100"))
    import flash_hopper_probe as probe

    caught = []

    def catch(kernel):
        def run(*args, grid, warmup, **kwargs):
            caught.append((kernel, args, kwargs))
        kernel.run = run

    for module in (flash_triton_forward, flash_triton_backward, tma):
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
                    if dtype == torch.bfloat16:
                        for config in (tma.TmaConfig(), tma.TmaConfig(prefetch=True)):
                            tma.tma_forward(q, k, v, causal, config)
                            tma.tma_backward(q, k, v, q, lse, q, causal, config)

    C = tma.TmaConfig
    for shape in probe.SHAPES.values():  # the probe's candidates, bf16 (its tile sweep causal)
        d = shape[-1]
        q, lse = meta(shape, torch.bfloat16), meta(shape[:-1], torch.float32)
        for m, n, w, s in probe.FORWARD[d]:
            for prefetch in (False, True):
                tma.tma_forward(q, q, q, True, C(block_m=m, block_n=n, num_warps=w, num_stages=s, prefetch=prefetch))
        for m, n, w, s in probe.DQ[d]:
            tma.tma_dq(q, q, q, q, lse, q, True, C(q_m=m, q_n=n, q_warps=w, q_stages=s))
        for m, n, w, s in probe.DKDV[d]:
            tma.tma_dkdv(q, q, q, lse, lse, q, True, C(kv_m=m, kv_n=n, kv_warps=w, kv_stages=s))
        (m, n, w, s), (qm, qn, qw, qs), (km, kn, kw, ks) = probe.FORWARD[d][0], probe.DQ[d][0], probe.DKDV[d][0]
        for causal in (True, False):
            for ws, diag in ((False, False), (True, False), (True, True)):
                if diag and not causal:
                    continue
                c = C(block_m=m, block_n=n, num_warps=w, num_stages=s, q_m=qm, q_n=qn, q_warps=qw, q_stages=qs,
                      kv_m=km, kv_n=kn, kv_warps=kw, kv_stages=ks, warp_specialize=ws, ws_diagonal=diag)
                tma.tma_forward(q, q, q, causal, c)
                tma.tma_backward(q, q, q, q, lse, q, causal, c)

    def arg_type(x):
        if isinstance(x, torch.Tensor):
            return "*" + {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[x.dtype]
        if isinstance(x, tma.TensorDescriptor):
            return mangle_type(x)  # tensordesc<dtype[block shape]>
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
        try:
            compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
        except Exception as e:  # the same failure in both versions counts as the same
            first_line = next(iter(str(e).splitlines()), "")
            out[key] = f"{FAILS} {type(e).__name__}: {first_line[:200]}"
            continue
        ptx = compiled.asm["ptx"]
        ptx = ptx.split("\t.section\t.debug")[0]
        ptx = "\n".join(line for line in ptx.splitlines() if not DEBUG_LINE.match(line))
        out[key] = f"{_digest(ptx)} sass {_digest(_sass(compiled.asm['cubin'], knobs.nvidia.nvdisasm.path))}"
    print(json.dumps(out))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _sass(cubin: bytes, nvdisasm: str) -> str:
    """The machine code ptxas made of the PTX, as nvdisasm prints it (instructions and their
    encodings; the cubin's line tables, which a helper call changes, are not printed)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([nvdisasm, "--print-code", "-hex", f.name], capture_output=True, text=True,
                              check=True).stdout


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
    p.add_argument("--list", action="store_true", help="print every launch, its PTX and SASS hashes, and the "
                   "launches whose SASS differs")
    p.add_argument("--strict", action="store_true", help="exit 1 also when only the SASS differs")
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
    ptx = {k: h.split(" sass ")[0] for k, h in after.items()}
    differ = sorted(k for k in set(before) | set(after) if before.get(k, "").split(" sass ")[0] != ptx.get(k))
    sass_only = sorted(k for k in after if k not in differ and before.get(k) != after[k])
    for key in sorted(after) if args.list else []:
        print(after[key], key)
    failed = sum(after[k].startswith(FAILS) for k in after if k not in differ)
    print(f"{len(after)} launches compiled for sm_90 (Triton {_triton_version()}): "
          + ("the same PTX in both versions" if not differ else f"{len(differ)} differ in PTX")
          + (f"; {failed} of them do not compile (the same failure in both versions)" if failed else ""))
    print("SASS: " + (f"the same for all {len(after) - len(differ)} launches of the same PTX" if not sass_only else
                      f"{len(sass_only)} launches of the same PTX differ (ptxas schedules around the labels that "
                      "mark an inlined helper's debug line records)"))
    for key in differ:
        print(f"  differs: {key} ({before.get(key)} -> {after.get(key)})")
    for key in sass_only if args.list else []:
        print(f"  SASS differs: {key}")
    return 1 if differ or (args.strict and sass_only) else 0


def _triton_version() -> str:
    import triton

    return triton.__version__


if __name__ == "__main__":
    sys.exit(main())
