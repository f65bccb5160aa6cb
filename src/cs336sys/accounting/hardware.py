"""Hardware descriptions the calculator evaluates the formulas for, each figure with its source.

`flops` is C (FLOP/s of one device for the compute dtype's matrix products), `bandwidth` is W (bytes/s
one device sends to the others: in the ring model an all-reduce's NCCL *bus* bandwidth equals W, see
`cs336sys.accounting.communication`), `memory` is bytes of device memory.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class Hardware:
    name: str
    flops: float
    bandwidth: float
    memory: float
    flops_source: str
    bandwidth_source: str
    memory_source: str
    copy_bandwidth: float | None = None  # device-memory copy, bytes/s (not used by the formulas; for reference)
    copy_source: str = ""

    def with_overrides(self, flops: float | None = None, bandwidth: float | None = None,
                       memory: float | None = None) -> Hardware:
        """This hardware with some figures replaced (their source becomes "given")."""
        out = self
        if flops is not None:
            out = replace(out, flops=flops, flops_source="given on the command line")
        if bandwidth is not None:
            out = replace(out, bandwidth=bandwidth, bandwidth_source="given on the command line")
        if memory is not None:
            out = replace(out, memory=memory, memory_source="given on the command line")
        return out

    def as_dict(self) -> dict:
        return asdict(self)


PRESETS: dict[str, Hardware] = {h.name: h for h in [
    Hardware(
        "tpu-v5p", flops=4.6e14, bandwidth=2 * 9e10, memory=95e9,
        flops_source="2025 handout, communication_accounting (c): C = 4.6e14 FLOP/s (TPU v5p, from the Scaling Book)",
        bandwidth_source="2025 handout, communication_accounting (c): W_ici = 2 * 9e10 bytes/s",
        memory_source="2025 handout, communication_accounting (b): 95e9 bytes per v5p device"),
    Hardware(
        "h100", flops=743.9e12, bandwidth=450e9, memory=85_017_493_504,
        # Kept from the project's first H100 run: results/peak/bf16.json (an 8192-cube bf16 product) at
        # commit f8644d05; results/matmul_peak/ now holds another GPU's (cs336sys.analysis.accounting reads
        # a current result of a preset's GPU in place of its constants).
        flops_source="measured on an NVIDIA H100 80GB HBM3 (2026-11-22), a constant since: bf16 8192-cube "
                     "product, results/peak/bf16.json at commit f8644d05",
        bandwidth_source="H100 SXM datasheet: NVLink 4, 450 GB/s each way",
        memory_source="measured: total_memory in that result's env",
        copy_bandwidth=3.0e12, copy_source="measured by this project: device-to-device copy, about 3.0 TB/s"),
    Hardware(
        "h200", flops=989.4e12, bandwidth=450e9, memory=141e9,
        flops_source="NVIDIA H200 SXM datasheet: dense bf16 (not measured here)",
        bandwidth_source="H200 SXM datasheet: NVLink 4, 450 GB/s each way (our all-reduces are checked "
                         "against it)",
        memory_source="NVIDIA H200 datasheet: 141e9 bytes",
        copy_bandwidth=4.3e12, copy_source="measured by this project: device-to-device copy, about 4.3 TB/s"),
]}
PRESETS["handout"] = replace(PRESETS["tpu-v5p"], name="handout")


def get_hardware(name: str | Hardware) -> Hardware:
    if isinstance(name, Hardware):
        return name
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown hardware {name!r}; presets: {', '.join(PRESETS)}") from None


def preset_for_gpu(gpu_name: str | None) -> Hardware | None:
    """The preset of a GPU as `torch.cuda.get_device_name` spells it ("NVIDIA H100 80GB HBM3"), or None."""
    if not gpu_name:
        return None
    for key in ("h200", "h100"):
        if key in gpu_name.lower():
            return PRESETS[key]
    return None
