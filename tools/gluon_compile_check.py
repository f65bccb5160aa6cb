"""Compile the Gluon attention kernels for sm_90 on a machine without a GPU; report registers and spills.

    PYTHONPATH=src python tools/gluon_compile_check.py [--only backward] [--json OUT.json]

The Gluon launchers (`flash_gluon.flash_attention_gluon_forward`, `flash_gluon_backward.flash_backward_gluon`)
are run on small CPU tensors with their kernel launches caught instead of run (as
`notes/runs/2026-11-25-h100-flash-refactor/kernel_equivalence.py` did for the `tl` kernels); each caught
launch is bound as Triton's launcher would bind it (same signature, constexprs and divisibility
attributes; seq 256 and 300 cover both integer specialisations)
and compiled by `triton.compile` with an explicit `GPUTarget("cuda", 90, 32)`: front end, TTGIR
passes, LLVM, PTX and ptxas (shipped with Triton) to a cubin. Then the PTX goes through ptxas again
with -v for registers, spill bytes and shared memory. Exit status 0 when every launch compiled.

The GPU hosts run Triton 3.6, whose Gluon API differs from later releases (3.9 removed
`tma.async_copy_global_to_shared`): check against that version, installed beside the project's:

    pip install --no-deps --target /tmp/triton36 triton==3.6.0
    PYTHONPATH=/tmp/triton36:src python tools/gluon_compile_check.py

A compile here is not a run: it catches API misuse, type and layout errors, shared memory over the
limit and spills, not wrong results or hangs (mbarrier phases, missing fences).

With --sass each launch's cubin is disassembled (cuobjdump, shipped with Triton) and every loop that issues
warpgroup MMAs is summarised in order: `HGMMA` runs, `wait<=N` (WARPGROUP.DEPBAR), `MUFU` runs (the
exponentials), barriers and mbarrier operations. That is where ptxas's schedule shows, e.g. whether a
forward step's exponentials come before the PV product's wait (`wait<=0`) or after it (notes/flash_attention.md,
"The forward's PV wait").
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path


def _ptxas_report(ptx: str) -> dict:
    import triton

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        done = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", str(src), "-o", str(Path(tmp) / "k.cubin")],
                              capture_output=True, text=True)
    text = done.stdout + done.stderr
    facts = {}
    for key, pattern in (("registers", r"Used (\d+) registers"), ("spill_stores", r"(\d+) bytes spill stores"),
                         ("spill_loads", r"(\d+) bytes spill loads"), ("stack", r"(\d+) bytes stack frame")):
        found = re.search(pattern, text)
        facts[key] = int(found.group(1)) if found else None
    return facts


_SASS_LINE = re.compile(r"^\s+/\*([0-9a-f]+)\*/\s+(.*?)\s*;")


def _sass(cubin: bytes) -> list[tuple[int, str]]:
    """(address, instruction) of every instruction in the cubin, by cuobjdump."""
    import triton

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        text = subprocess.run([str(cuobjdump), "-sass", str(path)], capture_output=True, text=True,
                              check=True).stdout
    return [(int(m.group(1), 16), m.group(2)) for m in map(_SASS_LINE.match, text.splitlines()) if m]


def loop_schedules(cubin: bytes) -> list[str]:
    """Each loop (a conditional backward branch: the unconditional ones return from ptxas's out-of-line
    mbarrier retries) that issues warpgroup MMAs and holds no such loop of its own, as its events in
    order: "HGMMAx4 SYNCSx1 HGMMAx8 wait<=1 MUFUx66 wait<=0 BARx1 SYNCSx1"."""
    code = _sass(cubin)
    loops = []
    for address, ins in code:
        target = re.search(r"^@!?P\d+ BRA (0x[0-9a-f]+)", ins)
        if target and int(target.group(1), 16) < address:
            loops.append((int(target.group(1), 16), address))
    with_mma = [(lo, hi) for lo, hi in loops if any("HGMMA" in ins for a, ins in code if lo <= a <= hi)]
    innermost = [(lo, hi) for lo, hi in with_mma
                 if not any((lo, hi) != (l2, h2) and lo <= l2 and h2 <= hi for l2, h2 in with_mma)]
    out = []
    for lo, hi in sorted(set(innermost)):
        events: list[list] = []
        for a, ins in code:
            if not lo <= a <= hi:
                continue
            op = ins.split()[1] if ins.startswith("@") else ins.split()[0]
            if op.startswith("WARPGROUP.DEPBAR"):
                name = "wait<=" + str(int(ins.rsplit(",", 1)[1].strip(), 16))
            elif op.split(".")[0] in ("HGMMA", "MUFU", "BAR", "SYNCS"):
                name = op.split(".")[0]
            else:
                continue
            if events and events[-1][0] == name and not name.startswith("wait"):
                events[-1][1] += 1
            else:
                events.append([name, 1])
        out.append(f"{(hi - lo) // 16 + 1} instructions: "
                   + " ".join(name if name.startswith("wait") else f"{name}x{n}" for name, n in events))
    return out


def _catch_launches(opts) -> list:
    """Run the launchers on CPU tensors with every Gluon launch caught: [(kernel, args, kwargs)]. The
    patches (kernels' `run`, the CUDA check) are undone before returning."""
    import torch
    from triton.runtime.jit import JITFunction

    from cs336sys.attention import (
        flash_gluon,
        flash_gluon_backward,
        flash_gluon_backward_common,
        flash_gluon_backward_ws,
        flash_gluon_forward,
        flash_gluon_forward_ws,
        flash_triton_backward,
    )

    caught = []
    patched = [(flash_triton_backward.backward_delta_kernel, "run"), (flash_gluon, "check_gluon_inputs")]
    for module in (flash_gluon_forward, flash_gluon_forward_ws, flash_gluon_backward, flash_gluon_backward_common,
                   flash_gluon_backward_ws):
        patched += [(value, "run") for value in vars(module).values()
                    if isinstance(value, JITFunction) and value.__module__ == module.__name__
                    and value.__name__.endswith("_kernel")]
    saved = [(obj, name, obj.__dict__.get(name, _UNSET)) for obj, name in patched]

    def catch(kernel):
        def run(*args, grid, warmup, **kwargs):
            caught.append((kernel, args, kwargs))
        return run

    try:
        for obj, name in patched[2:]:
            setattr(obj, name, catch(obj))
        flash_triton_backward.backward_delta_kernel.run = lambda *a, **k: None  # the `tl` D kernel: not compiled here
        flash_gluon.check_gluon_inputs = lambda *a: None  # CPU tensors stand in for CUDA ones
        dtypes = [{"bf16": torch.bfloat16, "fp16": torch.float16}[name] for name in opts.dtypes.split(",")]
        for d, dtype, seq, causal in itertools.product([int(x) for x in opts.d.split(",")], dtypes,
                                                       [int(x) for x in opts.seqs.split(",")],
                                                       [bool(int(x)) for x in opts.causal.split(",")]):
            q = torch.randn(2, 3, seq, d, dtype=dtype)
            if opts.only != "backward":
                flash_gluon.flash_attention_gluon_forward(q, q, q, causal)
            if opts.only != "forward":
                lse = torch.zeros(q.shape[:-1], dtype=torch.float32)
                for tiles in flash_gluon.BACKWARD_VARIANTS[d]:
                    flash_gluon.flash_attention_gluon_backward(q, q, q, q, lse, q, causal, tiles)
    finally:
        for obj, name, value in saved:
            if value is _UNSET:
                delattr(obj, name)
            else:
                setattr(obj, name, value)
    return caught


_UNSET = object()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=("forward", "backward"), default=None)
    p.add_argument("--d", default="64,128", help="head dims, comma-separated")
    p.add_argument("--dtypes", default="bf16,fp16")
    p.add_argument("--seqs", default="256,300", help="sequence lengths (a multiple of 16 or not: the two "
                   "integer specialisations)")
    p.add_argument("--causal", default="1,0")
    p.add_argument("--json", type=Path, default=None, help="write the report here too")
    p.add_argument("--sass", action="store_true", help="summarise each MMA loop of the SASS (see above)")
    opts = p.parse_args(argv)

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    caught = _catch_launches(opts)

    report, seen, failed = [], set(), 0
    for kernel, args, kwargs in caught:
        binder = create_function_from_signature(kernel.signature, kernel.params, backend)
        bound, specialization, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
        key = json.dumps([kernel.__name__, signature, {str(k): str(v) for k, v in constexprs.items()},
                          str(attrs), options.num_warps], sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        named = {kernel.arg_names[path[0]]: value for path, value in constexprs.items() if len(path) == 1}
        row = {"kernel": kernel.__name__, "dtype": str(signature.get("q_desc", "")).split("[")[0],
               **{k: v for k, v in named.items() if k.isupper()}, "num_warps": options.num_warps,
               "div16": [kernel.arg_names[path[0]] for path, attr in attrs.items()
                         if len(path) == 1 and "tt.divisibility" in str(attr) and
                         signature[kernel.arg_names[path[0]]] == "i32"]}
        start = time.time()
        try:
            source = (GluonASTSource if isinstance(kernel, GluonJITFunction) else ASTSource)(kernel, signature,
                                                                                              constexprs, attrs)
            compiled = triton.compile(source, target=target, options=options.__dict__)
        except Exception as exc:
            failed += 1
            traceback.print_exc()
            row["error"] = f"{type(exc).__name__}: {exc}"[-3000:]
        else:
            row |= {"shared": compiled.metadata.shared, "seconds": round(time.time() - start, 1),
                    **_ptxas_report(compiled.asm["ptx"])}
            if opts.sass:
                row["loops"] = loop_schedules(compiled.asm["cubin"])
        report.append(row)
        print(json.dumps(row), flush=True)
    print(f"{len(report) - failed} of {len(report)} Gluon launches compiled for sm_90 (Triton {triton.__version__})")
    if opts.json:
        opts.json.write_text(json.dumps(report, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
