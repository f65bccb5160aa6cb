"""The clock and power sampler (cs336sys.gpu_clocks), with a stand-in nvidia-smi on PATH."""

import os
import stat
import time

import pytest

from cs336sys.gpu_clocks import ClockSampler, gpu_selector

# Prints the power limit once, or, when asked to loop (-lms), one sample every 50 ms: a line nvidia-smi
# writes for an unsupported field first, then the given clocks and powers in turn, then stays quiet.
FAKE = """#!/usr/bin/env python3
import sys, time
args = sys.argv[1:]
with open({log!r}, "a") as f:
    f.write(" ".join(args) + "\\n")
if "--query-gpu=power.limit" in args:
    print("700.00")
    sys.exit(0)
print("[N/A], [N/A]", flush=True)
for mhz, watts in {samples!r}:
    print(f"{{mhz}}, {{watts}}", flush=True)
    time.sleep(0.05)
time.sleep(60)
"""


@pytest.fixture
def fake_smi(tmp_path, monkeypatch):
    def install(samples):
        log = tmp_path / "calls.log"
        script = tmp_path / "bin" / "nvidia-smi"
        script.parent.mkdir(exist_ok=True)
        script.write_text(FAKE.format(log=str(log), samples=samples))
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
        return log

    return install


def _wait_for(sampler, count, timeout=10.0):
    deadline = time.monotonic() + timeout
    while len(sampler.samples) < count and time.monotonic() < deadline:
        time.sleep(0.02)


def test_medians_of_the_samples_in_a_window(fake_smi):
    log = fake_smi([(1980, 120.5), (1710, 699.0), (1695, 700.2), (1650, 698.7)])
    with ClockSampler(selector="GPU-abc", interval_ms=50) as sampler:
        _wait_for(sampler, 4)
    assert [s[1:] for s in sampler.samples] == [(1980, 120.5), (1710, 699.0), (1695, 700.2), (1650, 698.7)]
    assert sampler.summary() == {"sm_clock_mhz": 1702.5, "sm_clock_min_mhz": 1650, "power_w": 698.85,
                                 "power_limit_w": 700.0, "clock_samples": 4}
    # a window: only the samples stamped inside it
    second = sampler.samples[1][0]
    assert sampler.summary(second, sampler.samples[2][0])["clock_samples"] == 2
    assert sampler.summary(second)["sm_clock_mhz"] == 1695
    assert sampler.summary(time.perf_counter() + 1) == {}
    calls = log.read_text().splitlines()
    assert all("-i GPU-abc" in c for c in calls) and any("-lms 50" in c for c in calls)
    assert sampler._process is None  # stopped on leaving the block


def test_no_samples_without_nvidia_smi_or_a_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # nvidia-smi is nowhere
    with ClockSampler(selector="GPU-abc") as sampler:
        pass
    assert sampler.samples == [] and sampler.summary() == {}
    assert gpu_selector("cpu") is None
    assert ClockSampler("cpu").start().summary() == {}


def test_stop_ends_the_sampling_process(fake_smi):
    fake_smi([(1800, 500.0)])
    sampler = ClockSampler(selector="0", interval_ms=50).start()
    process = sampler._process
    _wait_for(sampler, 1)
    sampler.stop()
    assert process.poll() is not None
    sampler.stop()  # twice: nothing left to stop
