"""The calculator: memory, FLOPs and communication of one training step of our Transformer, per
device, for a model size, a strategy, a device count and a hardware description.

Every number is a formula of `memory`, `compute` or `communication` evaluated for the setup; a row
keeps its formula, so the command line can print it (`--formulas`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy as sp

from cs336sys.accounting import communication as comm
from cs336sys.accounting import compute, memory
from cs336sys.accounting.hardware import Hardware, get_hardware
from cs336sys.accounting.symbols import N_FSDP, N_TP, K, N, W, b, c, evaluate, s
from cs336sys.sizes import ModelSize, get_size

BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}
FUSED = "fused RMSNorm, SwiGLU gate and RoPE kernels"  # the leaderboard step's fused_elementwise


@dataclass(frozen=True)
class Setup:
    size: ModelSize
    gpus: int
    strategy: str
    hardware: Hardware
    tp: int = 1
    batch_size: int = 4  # sequences per data-parallel rank
    context_length: int = 2048
    master_dtype: str = "fp32"  # parameters, gradients and AdamW moments
    compute_dtype: str = "bf16"  # activations and what FSDP/TP send
    attention: str = "naive"
    checkpoint: str = "none"  # one of memory.CHECKPOINT_MODES
    checkpoint_blocks: int | None = None  # K blocks checkpointed; None: all of them (0 when checkpoint is none)
    loss_chunk_tokens: int | None = None  # cross-entropy over chunks of this many tokens; None: whole logits
    compute_copy: bool = False  # a compute-dtype copy of the parameters is kept (what FSDP's gathers send)
    fused_elementwise: bool = False  # the blocks' RMSNorm, SwiGLU gate and RoPE: FUSED (memory.fused_block_saved_terms)

    @property
    def checkpointed(self) -> int:
        """K, the blocks checkpointed."""
        if self.checkpoint == "none":
            return 0
        return self.size.num_layers if self.checkpoint_blocks is None else self.checkpoint_blocks

    def checkpoint_note(self) -> str:
        if self.checkpointed == 0:
            return "no checkpointing"
        return f"{self.checkpointed} of {self.size.num_layers} blocks checkpointed ({self.checkpoint})"

    def describe_checkpointing(self) -> str:
        layers = self.size.num_layers
        if self.checkpoint == "none" or self.checkpointed == 0:
            return f"no activation checkpointing (all {layers} blocks keep their activations)"
        kept = "input and attention's output (selective)" if self.checkpoint == "selective" else "input"
        return (f"{self.checkpointed} of {layers} blocks checkpointed (each keeps its {kept}; "
                f"one block's activations recomputed at a time)")


@dataclass
class Row:
    group: str
    quantity: str
    value: float
    unit: str
    formula: sp.Basic | None = None
    note: str = ""


@dataclass
class Plan:
    setup: Setup
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def value(self, quantity: str) -> float:
        return next(r.value for r in self.rows if r.quantity == quantity)


def _bytes(name: str, what: str) -> int:
    try:
        return BYTES[name]
    except KeyError:
        raise ValueError(f"unknown {what} dtype {name!r}; known: {', '.join(BYTES)}") from None


def make_setup(model: str, gpus: int, strategy: str, hardware: str | Hardware = "h100", tp: int | None = None,
               **kwargs) -> Setup:
    """Check a setup: a known size, strategy and dtypes, and device counts the strategy can use."""
    size = get_size(model)
    hw = get_hardware(hardware)
    if strategy not in memory.STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; known: {', '.join(memory.STRATEGIES)}")
    if gpus < 1:
        raise ValueError(f"--gpus must be at least 1, got {gpus}")
    if strategy == "single" and gpus != 1:
        raise ValueError("strategy 'single' runs on one GPU; use ddp, zero1, fsdp, tp or fsdp_tp for more")
    if strategy == "tp":
        if tp not in (None, gpus):
            raise ValueError(f"strategy 'tp' splits every block over all {gpus} GPUs; --tp {tp} contradicts it")
        tp = gpus
    elif strategy == "fsdp_tp":
        if not tp or tp < 1 or gpus % tp:
            raise ValueError(f"strategy 'fsdp_tp' needs --tp dividing --gpus ({gpus}), got {tp}")
    elif tp not in (None, 1):
        raise ValueError(f"--tp applies to strategies tp and fsdp_tp, not {strategy!r}")
    tp = tp or 1
    if size.num_heads % tp or size.d_ff % tp:
        raise ValueError(f"tensor parallelism over {tp} GPUs needs it to divide the heads ({size.num_heads}) "
                         f"and d_ff ({size.d_ff}) of {size.name}")
    setup = Setup(size, gpus, strategy, hw, tp=tp, **kwargs)
    _bytes(setup.master_dtype, "master")
    _bytes(setup.compute_dtype, "compute")
    if setup.attention not in ("naive", "flash"):
        raise ValueError(f"unknown attention {setup.attention!r}; known: naive, flash")
    if setup.batch_size < 1 or setup.context_length < 1:
        raise ValueError("batch size and context length must be positive")
    _check_checkpointing(setup)
    if setup.loss_chunk_tokens is not None and setup.loss_chunk_tokens < 1:
        raise ValueError(f"--loss-chunk-tokens must be a positive number of tokens, got {setup.loss_chunk_tokens}")
    return setup


def _check_checkpointing(setup: Setup) -> None:
    if setup.checkpoint not in memory.CHECKPOINT_MODES:
        raise ValueError(f"unknown checkpoint mode {setup.checkpoint!r}; known: {', '.join(memory.CHECKPOINT_MODES)}")
    layers, k = setup.size.num_layers, setup.checkpoint_blocks
    if k is not None:
        if setup.checkpoint == "none":
            raise ValueError(f"--checkpoint-blocks {k} needs --checkpoint every or selective (it is none)")
        if not 0 <= k <= layers:
            raise ValueError(f"--checkpoint-blocks must be between 0 and the {layers} blocks of {setup.size.name}, "
                             f"got {k}")
    if setup.checkpoint != "none":
        memory.checkpointed_block_terms(setup.attention, setup.checkpoint)  # selective needs flash


def values(setup: Setup) -> dict:
    v = compute.model_values(setup.size, setup.batch_size, setup.context_length)
    v.update({cls: evaluate(e, v) for cls, e in memory.PARAMETER_CLASSES.items()})
    v.update({N: setup.gpus, N_TP: setup.tp, N_FSDP: setup.gpus // setup.tp, W: setup.hardware.bandwidth,
              K: setup.checkpointed})
    if setup.loss_chunk_tokens is not None:
        v[c] = min(setup.loss_chunk_tokens, setup.batch_size * setup.context_length)  # the last chunk may be short
    return v


def plan(setup: Setup) -> Plan:
    out = Plan(setup)
    v = values(setup)
    master, act = BYTES[setup.master_dtype], BYTES[setup.compute_dtype]
    div = memory.division(setup.strategy)
    tp = div.tensor
    hw = setup.hardware

    def add(group: str, quantity: str, formula: sp.Basic, unit: str, note: str = "") -> float:
        value = evaluate(formula, v)
        out.rows.append(Row(group, quantity, value, unit, formula, note))
        return value

    add("model", "parameters", memory.PARAMETERS, "")
    add("model", "tokens per step (all GPUs)", b * s * div.batch, "")
    strategy = setup.strategy
    state = [add("memory per GPU", "parameters", memory.parameter_bytes(strategy, master), "B"),
             add("memory per GPU", "gradients", memory.gradient_bytes(strategy, master), "B"),
             add("memory per GPU", "optimizer state (AdamW)", memory.optimizer_state_bytes(strategy, master), "B")]
    if setup.compute_copy:  # e.g. the leaderboard step: its optimizer rewrites a bf16 copy of each shard
        state.append(add("memory per GPU", "parameters, compute-dtype copy", memory.parameter_bytes(strategy, act),
                         "B", f"{setup.compute_dtype}, kept beside the {setup.master_dtype} master weights"))
    # The count is tested for the unsplit eager model in fp32 with naive attention, no checkpointing
    # (the fused block's terms are tested apart, block by block).
    exact = (setup.compute_dtype == "fp32" and setup.attention == "naive" and tp == 1
             and setup.checkpointed == 0 and setup.loss_chunk_tokens is None and not setup.fused_elementwise)
    formula = memory.model_activation_bytes(act, setup.attention, tp, checkpoint=setup.checkpoint,
                                            loss_chunked=setup.loss_chunk_tokens is not None,
                                            fused_elementwise=setup.fused_elementwise)
    fused = f"; {FUSED}" if setup.fused_elementwise else ""
    activations = add("memory per GPU", "saved activations", formula, "B",
                      ("as the eager model saves them (tested)" if exact else "estimate: the exact fp32 count, at "
                       f"{act} bytes per element ({setup.compute_dtype} compute)"
                       f"{', split as tensor parallelism would' if tp != 1 else ''}") + f"; {setup.checkpoint_note()}"
                      + fused)
    total = sum(state) + activations
    out.rows.append(Row("memory per GPU", "total", total, "B", None,
                        "fits" if total <= hw.memory else f"does not fit in {hw.memory / 1e9:.1f} GB"))
    causal = setup.attention == "flash"
    flops = add("compute per GPU", "train-step FLOPs", compute.train_step_flops(causal, tp), "FLOP",
                "causal pairs only (flash skips masked tiles)" if causal else "full score matrix (naive)")
    compute_s = flops / hw.flops
    out.rows.append(Row("compute per GPU", "time at C", compute_s, "s"))
    comm_s = 0.0
    for t in comm.step_transfers(setup.strategy, grad_bytes=master, param_bytes=master, compute_bytes=act):
        comm_s += add("communication per GPU", f"{t.label}: {t.collective.replace('_', '-')} x{evaluate(t.count, v)}"
                      f" over {evaluate(t.group, v)}", t.time(), "s",
                      f"{evaluate(t.bytes_sent(), v) / 1e9:.3f} GB sent")
    out.rows.append(Row("communication per GPU", "total", comm_s, "s"))
    ratio = comm_s / compute_s if compute_s else float("inf")
    out.rows.append(Row("summary", "communication / compute", ratio, "",
                        note="compute-bound if overlapped" if ratio <= 1 else "communication-bound"))
    out.rows.append(Row("summary", "step time lower bound", max(compute_s, comm_s), "s",
                        note="max(compute at C, communication at W): perfect overlap"))
    return out


def _fmt(value: float, unit: str) -> str:
    if unit == "B":
        return f"{value / 1e9:,.3f} GB"
    if unit == "s":
        return f"{value * 1e3:,.3f} ms"
    if unit == "FLOP":
        return f"{value / 1e12:,.2f} TFLOP"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.3f}"


def render(p: Plan, formulas: bool = False) -> str:
    s, hw = p.setup, p.setup.hardware
    lines = [f"model {s.size.name}: d_model {s.size.d_model}, d_ff {s.size.d_ff}, {s.size.num_layers} layers, "
             f"{s.size.num_heads} heads, vocab {s.size.vocab_size}",
             f"strategy {s.strategy} on {s.gpus} GPU(s)" + (f" (tensor-parallel groups of {s.tp})" if s.tp > 1 else "")
             + f"; batch {s.batch_size} x context {s.context_length} per data-parallel rank; "
             f"master {s.master_dtype}, compute {s.compute_dtype}, {s.attention} attention",
             f"activations: {s.describe_checkpointing()}; "
             + (f"blocks with {FUSED}; " if s.fused_elementwise else "") + "loss over "
             + (f"chunks of {s.loss_chunk_tokens} tokens" if s.loss_chunk_tokens else "the whole logits"),
             f"hardware {hw.name}: C = {hw.flops / 1e12:,.1f} TFLOP/s ({hw.flops_source})",
             f"  W = {hw.bandwidth / 1e9:,.1f} GB/s ({hw.bandwidth_source})",
             f"  memory = {hw.memory / 1e9:,.1f} GB ({hw.memory_source})", ""]
    width = max(len(r.quantity) for r in p.rows)
    group = None
    for r in p.rows:
        if r.group != group:
            group = r.group
            lines.append(group)
        line = f"  {r.quantity:<{width}}  {_fmt(r.value, r.unit):>18}"
        if r.note:
            line += f"  {r.note}"
        lines.append(line)
        if formulas and r.formula is not None:
            lines.append(f"  {'':<{width}}  = {r.formula}")
    return "\n".join(lines) + "\n"


def as_json(p: Plan) -> dict:
    return {"setup": {"model": p.setup.size.name, "gpus": p.setup.gpus, "strategy": p.setup.strategy, "tp": p.setup.tp,
                      "batch_size": p.setup.batch_size, "context_length": p.setup.context_length,
                      "master_dtype": p.setup.master_dtype, "compute_dtype": p.setup.compute_dtype,
                      "attention": p.setup.attention, "checkpoint": p.setup.checkpoint,
                      "checkpoint_blocks": p.setup.checkpointed, "checkpointing": p.setup.describe_checkpointing(),
                      "loss_chunk_tokens": p.setup.loss_chunk_tokens, "compute_copy": p.setup.compute_copy,
                      "fused_elementwise": p.setup.fused_elementwise,
                      "hardware": p.setup.hardware.as_dict()},
            "rows": [{"group": r.group, "quantity": r.quantity, "value": r.value, "unit": r.unit,
                      "formula": str(r.formula) if r.formula is not None else None, "note": r.note} for r in p.rows]}
