"""Implementation, Hopper only: the Gluon FlashAttention (`FlashAttentionGluon`), its tile tables and launchers.

The 8B step's attention "gluon" and the flash_leaderboard_gluon points run it, beside the
`triton.language` kernels (`flash_triton`).

`FlashAttentionGluon.apply(q, k, v, is_causal=False)` takes (batch, seq, d) or (batch, heads, seq, d)
tensors in bfloat16 or float16 with d in {64, 128} on a Hopper (compute capability 9.0) CUDA GPU, where
Triton ships Gluon (3.6 on the GPU hosts). The forward is the Gluon kernel
(`flash_gluon_forward_ws`, warp-specialised, by default); the backward is the Gluon backward
(`flash_gluon_backward_ws` by default: warp-specialised, 5 products per tile pair, dQ by TMA
reduce-add; or the single-partition `flash_gluon_backward`) or the `triton.language` backward
(`flash_triton.flash_attention_triton_backward`), both from the same natural-log L:
`FlashAttentionGluon.apply(q, k, v, is_causal, backward)` with backward "gluon" or "tl", or None for the
environment variable CS336SYS_GLUON_BACKWARD (default "gluon", the faster of the two). Anything else
is refused with `GluonUnsupported`, which says why: the `tl` kernels (`flash_triton`) are the fallback
everywhere the Gluon path cannot run.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from cs336sys.attention.inputs import check_attention_inputs

GLUON_DTYPES = (torch.bfloat16, torch.float16)
GLUON_HEAD_DIMS = (64, 128)
HOPPER = (9, 0)


class GluonUnsupported(ValueError):
    """The Gluon kernels cannot run these inputs here (the message says why)."""


@dataclass(frozen=True)
class GluonTiles:
    """One launch of the forward: query rows and keys per tile, ring depth, warps, loop schedule;
    warp-specialised (`flash_gluon_forward_ws`): 128 rows as two 4-warp consumer warpgroups plus a
    producer warp, with those registers per thread (then block_m is 128, num_warps 4, overlap on)."""
    block_m: int
    block_n: int
    stages: int
    num_warps: int
    overlap: bool
    consumer_regs: int = 0  # 0: not warp-specialised
    producer_regs: int = 24
    tiles_first: bool = False  # warp-specialised: grid (query tiles, batch*heads), so CTAs share a head's K, V
    max_regs: int = 0  # warp-specialised: registers per thread at launch (ptxas's .maxnreg); 0: the compiler's
    p_late: bool = False  # warp-specialised: P carried in fp32 to the next step, cast just before its PV product
    pingpong: bool = False  # warp-specialised: the two consumers take turns to issue their products
    pin: bool = False  # warp-specialised: the softmax kept before the PV product's wait (a scratch store)

    def __str__(self) -> str:
        if self.consumer_regs:
            return (f"{self.block_m}x{self.block_n}/s{self.stages}/ws r{self.consumer_regs}/{self.producer_regs}"
                    + ("/tiles-first" if self.tiles_first else "") + (f"/max{self.max_regs}" if self.max_regs else "")
                    + ("/p-late" if self.p_late else "") + ("/pingpong" if self.pingpong else "")
                    + ("/pin" if self.pin else ""))
        schedule = "overlap" if self.overlap else "serial"
        return f"{self.block_m}x{self.block_n}/w{self.num_warps}/s{self.stages}/{schedule}"


# The forward's tiles by head dimension: the warp-specialised kernel (producer warp, two consumer
# warpgroups of 64 rows each), 128 keys a tile, as deep a ring as shared memory holds beside Q (4 slots
# at d 64, 3 at d 128), and the grid's first axis the query tiles, so that the CTAs running together
# share one head's K and V in L2; the PV product's wait kept after the softmax (`pin`) and P cast just
# before its product (`p_late`). On one H100, cuDNN's forward timed in turn with each, medians of 5
# rounds: 0.97x cuDNN at the 2025 shape and 0.93x at the 2026 one, against 1.06x and 0.96x without the
# two options (notes/flash_attention.md, "The forward's PV wait, P's cast and two CTAs an SM").
FORWARD_TILES = {
    64: GluonTiles(128, 128, 4, 4, True, consumer_regs=240, tiles_first=True, p_late=True, pin=True),
    # Q 32 KiB + 3 x 64 KiB of K, V: 229.7 KB
    128: GluonTiles(128, 128, 3, 4, True, consumer_regs=240, tiles_first=True, p_late=True, pin=True),
}


@dataclass(frozen=True)
class GluonBackwardTiles:
    """One launch of the Gluon backward: query rows per step (the Q/dO ring's tiles), keys per program
    (K and V held in shared memory), ring depth, warps (4 per warpgroup; each warp owns 16 keys).
    Warp-specialised (`flash_gluon_backward_ws`) when consumer_regs is set: a producer warp and two
    4-warp consumer warpgroups of 64 keys each, with those registers per thread (then block_m is 64,
    block_n 128 and num_warps 4, the default partition's)."""
    block_m: int
    block_n: int
    stages: int
    num_warps: int
    consumer_regs: int = 0  # 0: not warp-specialised
    producer_regs: int = 24
    shared_ds: bool = True  # warp-specialised: dQ over both halves' dS (else each warpgroup's own keys)
    tiles_first: bool = True  # warp-specialised: grid (key tiles, batch*heads), so CTAs share a head's Q, dO
    rotate: int = 0  # warp-specialised: a step's dK and dQ products issued in the next step (1), its dQ late (2),
    # its dS stored before the previous step is finished (3), its L and D loaded in the step before (4)
    swap_ab: int = 0  # warp-specialised: keys on the MMA rows (S^T, dP^T), P and dS^T kept in registers;
    # dV's product issued before dS is formed (1) or after it (2)
    dq_fragments: bool = False  # warp-specialised: the dQ workspace in the accumulators' register order
    # (`flash_gluon_backward_common.add_dq`; where seq_q is a multiple of 64)
    stats_smem: bool = False  # warp-specialised, rotated or swapped: each step's L and D loaded by the producer (TMA)
    # into the ring with Q and dO, read by the consumers from shared memory (with dq_fragments, where
    # seq_q is a multiple of 64: `flash_gluon_backward_ws.flash_backward_gluon_ws`)
    persistent: bool = False  # warp-specialised: at most one CTA an SM, each taking (key tile, head) items in
    # turn, in the plain grid's order
    dq_full: bool = False  # rotated: each warpgroup's dQ share over its own 64 keys at full width (n64 products,
    # 40 warpgroup MMAs a step, cuDNN's count) instead of half the columns over both halves of dS (n32, 48)

    def __str__(self) -> str:
        if self.consumer_regs:
            return (f"bwd q{self.block_m}/kv{self.block_n}/s{self.stages}/ws r{self.consumer_regs}/"
                    f"{self.producer_regs}" + ("" if self.shared_ds else "/own-dq")
                    + ("" if self.tiles_first else "/heads-first")
                    + {0: "", 1: "/rotated", 2: "/rotated-late",
                       3: "/rotated-ds-first"}.get(self.rotate, f"/rotate={self.rotate}")
                    + {0: "", 1: "/swapped", 2: "/swapped-late-dv"}.get(self.swap_ab, f"/swap_ab={self.swap_ab}")
                    + ("/dq-fragments" if self.dq_fragments else "") + ("/stats-smem" if self.stats_smem else "")
                    + ("/persistent" if self.persistent else "") + ("/dq-full" if self.dq_full else ""))
        return f"bwd q{self.block_m}/kv{self.block_n}/w{self.num_warps}/s{self.stages}"

    def refusal(self, d: int) -> str | None:
        """Why the backward kernel cannot take these tiles (None: it can)."""
        if self.consumer_regs:
            if (self.block_m, self.block_n, self.num_warps) not in ((64, 128, 4), (128, 128, 4)):
                return f"{self}: the warp-specialised backward takes q64 or q128, kv128 and 4-warp consumers"
            if self.block_m == 128 and not self.swap_ab:
                return f"{self}: steps of 128 queries take the swapped consumer (swap_ab)"
            if self.rotate not in (0, 1, 2, 3):
                return f"{self}: rotate is 0 (off), 1, 2 (dQ late) or 3 (dS first)"
            if self.rotate and not self.shared_ds:
                return f"{self}: the rotated steps share dS between the warpgroups"
            if self.swap_ab not in (0, 1, 2):
                return f"{self}: swap_ab is 0 (off), 1 or 2 (dV late)"
            if self.swap_ab and (self.rotate or not self.shared_ds):
                return f"{self}: the swapped steps share dS between the warpgroups and are not rotated"
            if self.stats_smem and not (self.rotate or self.swap_ab):
                return f"{self}: L and D in the ring take the rotated or the swapped steps"
            if self.stats_smem and not self.dq_fragments:
                return f"{self}: L and D in the ring take the dQ workspace in fragment order (dq_fragments)"
            if self.dq_full and (not self.rotate or self.persistent):
                return f"{self}: dQ at full width takes the rotated steps and the plain grid"
            return None
        if self.stats_smem or self.persistent or self.dq_full:
            return (f"{self}: L and D in the ring, the persistent grid and dQ at full width take the "
                    "warp-specialised kernel")
        if self.num_warps % 4 or self.block_n % (16 * self.num_warps):
            return f"{self}: whole warpgroups, 16 keys per warp"
        if self.block_m != 64:  # one warpgroup MMA high; keys, a multiple of 64, line up on the diagonal
            return f"{self}: query tiles of 64 rows"
        if d % (8 * (self.num_warps // 4)):
            return f"{self}: d={d} cannot be split between {self.num_warps // 4} warpgroups"
        return None


# The backward's tiles by head dimension (first: the default): the warp-specialised kernel
# (`flash_gluon_backward_ws`: a producer warp, two consumer warpgroups of 64 keys each, dQ by TMA
# reduce-add), grid key tiles first. At d 64 a 4-deep Q/dO ring and each step's dK and dQ products
# issued in the next step (`flash_gluon_backward_rotated`), with each step's L and D loaded by the
# producer into the ring (`stats_smem`; 0.97-0.98x cuDNN's backward at the 2025 shape on one H100,
# against 1.05x for the entry after it, which loads them in the consumers). At d 128 the keys on the MMA rows
# (`flash_gluon_backward_swapped`: P and dS^T stay in registers for dV and dK, which frees the shared
# memory for a 3-deep ring), dV's product issued once dS is formed, L and D in the ring too (0.97-0.98x
# cuDNN's backward at the 2026 shape on one H100, against 1.00-1.01x for the second entry; the rotation
# spills there, 720-1364 bytes). Both with the dQ workspace in the accumulators' register order
# (`dq_fragments`: no bank conflicts storing dQ). On one H100, before `stats_smem`: 1.01x cuDNN's
# backward at the 2025 shape, 0.99x at the 2026 one (1.10x and 1.05x without `dq_fragments`, the entry
# after the rotate=3 one at d 64 and third at d 128),
# against 1.3-1.5x for the `tl` backward
# (notes/flash_attention.md, "Warp-specialised backward", "Keys on the MMA rows" and "dQ in register
# order"). Then the variants measured beside them (at d 64 also steps of 128 queries,
# FlashAttention-3's d 64 tiles: correct, but 2.8x cuDNN's time, spilling the 128-query S^T and dP^T),
# and the single-partition kernel (`flash_gluon_backward`) with its tiles.
BACKWARD_VARIANTS = {
    64: [GluonBackwardTiles(64, 128, 4, 4, consumer_regs=240, rotate=1, dq_fragments=True, stats_smem=True),
         GluonBackwardTiles(64, 128, 4, 4, consumer_regs=240, rotate=1, dq_fragments=True),
         GluonBackwardTiles(64, 128, 4, 4, consumer_regs=240, rotate=3, dq_fragments=True),  # dS first: 1.07x, slower
         GluonBackwardTiles(64, 128, 4, 4, consumer_regs=240, rotate=1),
         GluonBackwardTiles(64, 128, 4, 4, consumer_regs=240, rotate=2),
         GluonBackwardTiles(64, 128, 4, 4, consumer_regs=240), GluonBackwardTiles(64, 128, 2, 4, consumer_regs=240),
         GluonBackwardTiles(64, 128, 4, 4, consumer_regs=240, shared_ds=False),
         GluonBackwardTiles(64, 128, 4, 4, consumer_regs=240, tiles_first=False),
         GluonBackwardTiles(64, 128, 4, 4, consumer_regs=240, swap_ab=1),
         GluonBackwardTiles(64, 128, 4, 4, consumer_regs=240, swap_ab=2),
         GluonBackwardTiles(128, 128, 3, 4, consumer_regs=240, swap_ab=2),  # FlashAttention-3's d 64 tiles: spills
         GluonBackwardTiles(64, 128, 3, 8), GluonBackwardTiles(64, 128, 2, 8), GluonBackwardTiles(64, 64, 2, 4),
         # the persistent grid: 1.07-1.38x cuDNN's, slower (notes/flash_attention.md, "The d 128 backward
         # takes L and D in the ring")
         GluonBackwardTiles(64, 128, 4, 4, consumer_regs=240, rotate=1, dq_fragments=True, stats_smem=True,
                            persistent=True),
         # dQ at full width, not timed yet (compiled on the CPU): in the rotated steps ptxas serialises the
         # warpgroup MMAs ("non wgmma instructions reading accumulator registers"), with dQ late it does not
         GluonBackwardTiles(64, 128, 4, 4, consumer_regs=240, rotate=1, dq_fragments=True, stats_smem=True,
                            dq_full=True),
         GluonBackwardTiles(64, 128, 4, 4, consumer_regs=240, rotate=2, dq_fragments=True, stats_smem=True,
                            dq_full=True)],
    128: [GluonBackwardTiles(64, 128, 3, 4, consumer_regs=240, swap_ab=2, dq_fragments=True, stats_smem=True),
          GluonBackwardTiles(64, 128, 3, 4, consumer_regs=240, swap_ab=2, dq_fragments=True),
          GluonBackwardTiles(64, 128, 3, 4, consumer_regs=240, swap_ab=2),
          GluonBackwardTiles(64, 128, 2, 4, consumer_regs=240, swap_ab=2),
          GluonBackwardTiles(64, 128, 3, 4, consumer_regs=240, swap_ab=1),
          GluonBackwardTiles(64, 128, 2, 4, consumer_regs=240, swap_ab=1),
          GluonBackwardTiles(64, 128, 2, 4, consumer_regs=240),
          GluonBackwardTiles(64, 128, 2, 4, consumer_regs=240, rotate=1),
          GluonBackwardTiles(64, 128, 2, 4, consumer_regs=240, rotate=2),
          GluonBackwardTiles(64, 128, 2, 4, consumer_regs=240, shared_ds=False),
          GluonBackwardTiles(64, 128, 2, 4, consumer_regs=240, tiles_first=False),
          GluonBackwardTiles(64, 128, 3, 8), GluonBackwardTiles(64, 128, 2, 8), GluonBackwardTiles(64, 64, 2, 4),
          # the persistent grid: 1.48-1.87x cuDNN's, slower (the same notes)
          GluonBackwardTiles(64, 128, 3, 4, consumer_regs=240, swap_ab=2, dq_fragments=True, stats_smem=True,
                             persistent=True)],
}
BACKWARD_TILES = {d: variants[0] for d, variants in BACKWARD_VARIANTS.items()}
BACKWARDS = ("gluon", "tl")
BACKWARD_ENV = "CS336SYS_GLUON_BACKWARD"


def backward_choice(choice: str | None = None) -> str:
    """Which backward `FlashAttentionGluon` runs: `choice` if given, else $CS336SYS_GLUON_BACKWARD, else
    "gluon" (the warp-specialised Gluon backward, measured faster than the `tl` one)."""
    choice = choice or os.environ.get(BACKWARD_ENV) or "gluon"
    if choice not in BACKWARDS:
        raise ValueError(f"unknown Gluon backward {choice!r} (from {BACKWARD_ENV} or the argument); "
                         f"known: {', '.join(BACKWARDS)}")
    return choice


def gluon_import_error() -> str | None:
    """Why Gluon's Hopper layer cannot be imported from this Triton (None: it can)."""
    try:
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.language.nvidia import hopper
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: F401
    except ImportError as exc:
        return f"this Triton has no Gluon Hopper layer ({exc})"
    missing = [name for name, mod in (("warpgroup_mma", hopper), ("tma", hopper), ("mbarrier", hopper),
                                      ("NVMMADistributedLayout", gl), ("allocate_shared_memory", gl))
               if not hasattr(mod, name)]
    return f"this Triton's Gluon lacks {', '.join(missing)}" if missing else None


def gluon_refusal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool) -> str | None:
    """Why the Gluon forward cannot take these inputs here, or None if it can."""
    check_attention_inputs(q, k, v, is_causal)
    if q.dtype not in GLUON_DTYPES:
        return f"the Gluon kernels take bfloat16 or float16, got {q.dtype}"
    if q.shape[-1] not in GLUON_HEAD_DIMS:
        return f"the Gluon kernels support head dimension d in {GLUON_HEAD_DIMS}, got d={q.shape[-1]}"
    if q.device.type != "cuda":
        return f"the Gluon kernels need CUDA tensors on a Hopper GPU, got {q.device}"
    return (capability_refusal(torch.cuda.get_device_capability(q.device), torch.cuda.get_device_name(q.device))
            or gluon_import_error())


def capability_refusal(capability: tuple[int, int], name: str) -> str | None:
    """Why a GPU of this compute capability cannot run the kernels (None: a Hopper can)."""
    if tuple(capability) != HOPPER:
        return (f"the Gluon kernels use Hopper's wgmma and TMA (compute capability 9.0); "
                f"{name} is {capability[0]}.{capability[1]}")
    return None


def device_refusal(device: str | torch.device) -> str | None:
    """Why the Gluon kernels cannot run on this device (None: a Hopper GPU with Gluon's Hopper layer)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return f"the Gluon kernels need a Hopper CUDA GPU, got device {device}"
    return (capability_refusal(torch.cuda.get_device_capability(device), torch.cuda.get_device_name(device))
            or gluon_import_error())


def check_gluon_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool) -> None:
    reason = gluon_refusal(q, k, v, is_causal)
    if reason is not None:
        raise GluonUnsupported(reason)


def _tma_ready(t: torch.Tensor) -> torch.Tensor:
    """Contiguous with a 16-byte aligned base, as TMA descriptors need."""
    t = t if t.is_contiguous() else t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def flash_attention_gluon_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                                  tiles: GluonTiles | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """O (q's shape and dtype) and natural-log L (q.shape[:-1], float32) without autograd."""
    check_gluon_inputs(q, k, v, is_causal)
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from cs336sys.attention.flash_gluon_forward import flash_forward_gluon_kernel

    q, k, v = _tma_ready(q), _tma_ready(k), _tma_ready(v)
    *lead, seq_q, d = q.shape
    seq_k = k.shape[-2]
    bh = math.prod(lead)
    tiles = tiles or FORWARD_TILES[d]
    element = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[q.dtype]

    def descriptor(t: torch.Tensor, rows: int, block_rows: int):
        flat = t.view(-1, d)
        layout = gl.NVMMASharedLayout.get_default_for([block_rows, d], element)
        return TensorDescriptor(flat, [bh * rows, d], [d, 1], [block_rows, d], layout)

    out = torch.empty_like(q)
    lse = torch.empty(lead + [seq_q], dtype=torch.float32, device=q.device)
    grid = (bh, math.ceil(seq_q / tiles.block_m))
    if tiles.tiles_first:
        grid = grid[::-1]
    qk_scale = 1.4426950408889634 / math.sqrt(d)
    k_desc, v_desc = descriptor(k, seq_k, tiles.block_n), descriptor(v, seq_k, tiles.block_n)
    if tiles.consumer_regs:
        from cs336sys.attention.flash_gluon_forward_ws import flash_forward_gluon_ws_kernel

        if (tiles.block_m, tiles.num_warps) != (128, 4):
            raise ValueError(f"the warp-specialised forward takes 128 rows and 4-warp consumers, not {tiles}")
        handle = flash_forward_gluon_ws_kernel[grid](
            descriptor(q, seq_q, 64), k_desc, v_desc, out, lse, seq_q, seq_k, qk_scale,
            HEAD_DIM=d, BLOCK_N=tiles.block_n, STAGES=tiles.stages, IS_CAUSAL=is_causal,
            PRODUCER_REGS=tiles.producer_regs, CONSUMER_REGS=tiles.consumer_regs, TILES_FIRST=tiles.tiles_first,
            num_warps=4, **({"maxnreg": tiles.max_regs} if tiles.max_regs else {}),
            **{name: True for name, on in (("P_LATE", tiles.p_late), ("PINGPONG", tiles.pingpong), ("PIN", tiles.pin))
               if on})
    else:
        handle = flash_forward_gluon_kernel[grid](
            descriptor(q, seq_q, tiles.block_m), k_desc, v_desc, out, lse, seq_q, seq_k, qk_scale,
            HEAD_DIM=d, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, STAGES=tiles.stages, IS_CAUSAL=is_causal,
            OVERLAP=tiles.overlap, num_warps=tiles.num_warps)
    LAUNCHED[str(tiles), d, is_causal] = handle
    return out, lse


def flash_attention_gluon_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                                   lse: torch.Tensor, grad_out: torch.Tensor, is_causal: bool,
                                   tiles: GluonBackwardTiles | None = None,
                                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV (shapes and dtypes of q, k, v) from the forward's O and natural-log L, by the Gluon
    backward (`flash_gluon_backward`)."""
    check_gluon_inputs(q, k, v, is_causal)
    from cs336sys.attention.flash_gluon_backward import flash_backward_gluon

    d = q.shape[-1]
    tiles = tiles or BACKWARD_TILES[d]
    reason = tiles.refusal(d)
    if reason is not None:
        raise ValueError(reason)
    q, k, v, out, grad_out = (_tma_ready(t) for t in (q, k, v, out, grad_out))
    lse = lse if lse.is_contiguous() else lse.contiguous()
    if tiles.consumer_regs:
        from cs336sys.attention.flash_gluon_backward_ws import flash_backward_gluon_ws

        dq, dk, dv, handle = flash_backward_gluon_ws(q, k, v, out, lse, grad_out, is_causal, tiles.stages,
                                                     tiles.producer_regs, tiles.consumer_regs, tiles.shared_ds,
                                                     tiles.tiles_first, tiles.rotate, tiles.swap_ab, tiles.block_m,
                                                     tiles.dq_fragments, tiles.stats_smem, tiles.persistent,
                                                     tiles.dq_full)
    else:
        dq, dk, dv, handle = flash_backward_gluon(q, k, v, out, lse, grad_out, is_causal, tiles.block_m,
                                                  tiles.block_n, tiles.stages, tiles.num_warps)
    LAUNCHED[str(tiles), d, is_causal] = handle
    return dq, dk, dv


# The compiled kernel of each (tiles, d, causal) launched in this process: registers, spills, shared
# memory for the benchmark's report.
LAUNCHED: dict = {}


class FlashAttentionGluon(torch.autograd.Function):
    """`FlashAttentionGluon.apply(q, k, v, is_causal=False, backward=None, backward_tiles=None)`: the Gluon
    forward, and the backward named by `backward_choice(backward)`: "gluon" (`flash_gluon_backward`) or
    "tl" (`flash_triton.flash_attention_triton_backward`, with `backward_tiles` as `flash_configs`
    writes them, e.g. "kv64x128/q128x64/w8/s3/split", or its table's), from the forward's O and L."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                backward: str | None = None, backward_tiles: str | None = None):
        from cs336sys.attention.flash_configs import BackwardConfig

        ctx.backward = backward_choice(backward)  # a bad name or tiles fail here, not in the backward pass
        ctx.backward_config = BackwardConfig.parse(backward_tiles) if backward_tiles else None
        out, lse = flash_attention_gluon_forward(q, k, v, is_causal)
        ctx.save_for_backward(lse, q, k, v, out)
        ctx.is_causal = is_causal
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        lse, q, k, v, out = ctx.saved_tensors
        if ctx.backward == "gluon":
            dq, dk, dv = flash_attention_gluon_backward(q, k, v, out, lse, grad_out, ctx.is_causal)
        else:
            from cs336sys.attention.flash_triton import flash_attention_triton_backward

            dq, dk, dv = flash_attention_triton_backward(q, k, v, out, lse, grad_out, ctx.is_causal,
                                                         ctx.backward_config)
        return dq, dk, dv, None, None, None
