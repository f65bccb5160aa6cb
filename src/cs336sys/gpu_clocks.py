"""The SM clock and power draw of a GPU while it is timed, so that a result says how its machine ran.

Called back to back, an attention backward holds an H100 at its 700 W power cap, and the SM clock
falls from 1,980 MHz to 1,600-1,800 MHz, by how much depending on the machine
(notes/flash_attention.md): a time is then a power-capped time, and two kernels timed on different
machines, or at different clocks, compare only with their clocks beside them.

    with ClockSampler("cuda:0") as clocks:
        ...                                  # the timed work
    clocks.summary()                         # {"sm_clock_mhz": 1710.0, "power_w": 694.1, ...}

`nvidia-smi` samples the clock and power every `interval_ms` in a thread; each sample is stamped with
the host's clock, so a summary can cover a window of the sampling. Where nvidia-smi does not run (no
NVIDIA driver, a CPU device) there are no samples and every summary is empty.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
import time

QUERY = "clocks.sm,power.draw"


def gpu_selector(device: object = None) -> str | None:
    """nvidia-smi's `-i` for a torch device: the GPU's UUID (CUDA_VISIBLE_DEVICES renumbers the devices
    torch sees, nvidia-smi's indices do not); None for a CPU device or without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    device = torch.device(device if device is not None else "cuda")
    if device.type != "cuda":
        return None
    uuid = str(torch.cuda.get_device_properties(device.index or 0).uuid)
    return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"


def _numbers(line: str) -> list[float] | None:
    try:
        return [float(x) for x in line.split(",")]
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


class ClockSampler:
    """nvidia-smi's SM clock (MHz) and power draw (W) of one GPU every `interval_ms`, from `start()`
    (or entering the `with` block) to `stop()`; `selector` is nvidia-smi's `-i` (see `gpu_selector`),
    a device (torch's) is turned into one."""

    def __init__(self, device: object = None, interval_ms: int = 100, selector: str | None = None) -> None:
        self.selector = selector if selector is not None else gpu_selector(device)
        self.interval_ms = interval_ms
        self.samples: list[tuple[float, float, float]] = []  # (host time, MHz, W)
        self.power_limit_w: float | None = None
        self._process: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    def _command(self, *args: str) -> list[str]:
        return ["nvidia-smi", *args, "--format=csv,noheader,nounits", "-i", self.selector]

    def start(self) -> ClockSampler:
        if self.selector is None or shutil.which("nvidia-smi") is None or self._process is not None:
            return self
        try:
            limit = subprocess.run(self._command("--query-gpu=power.limit"), capture_output=True, text=True,
                                   timeout=10).stdout.strip()
            self.power_limit_w = (_numbers(limit) or [None])[0]
        except (OSError, subprocess.SubprocessError):
            return self
        self._process = subprocess.Popen(self._command(f"--query-gpu={QUERY}", "-lms", str(self.interval_ms)),
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self._reader = threading.Thread(target=self._read, args=(self._process,), daemon=True)
        self._reader.start()
        return self

    def _read(self, process: subprocess.Popen) -> None:
        for line in process.stdout:
            values = _numbers(line)
            if values is not None and len(values) == 2:
                self.samples.append((time.perf_counter(), values[0], values[1]))

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if self._reader is not None:
            self._reader.join(timeout=5)

    def __enter__(self) -> ClockSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def summary(self, start: float | None = None, end: float | None = None) -> dict:
        """Medians of the samples taken between host times `start` and `end` (`time.perf_counter()`;
        all of them by default): SM clock and power, the lowest clock, how many samples, the power
        limit. Empty without samples."""
        inside = [(mhz, watts) for t, mhz, watts in self.samples
                  if (start is None or t >= start) and (end is None or t <= end)]
        if not inside:
            return {}
        clocks, power = [m for m, _ in inside], [w for _, w in inside]
        return {"sm_clock_mhz": statistics.median(clocks), "sm_clock_min_mhz": min(clocks),
                "power_w": statistics.median(power), "power_limit_w": self.power_limit_w,
                "clock_samples": len(inside)}
