"""`summarize_snapshot`'s whole JSON on a seeded synthetic snapshot, against the copy kept in tests/data:
a refactor of the summary must leave every field as it was (regenerate the copy only for a change of
behaviour, with `python tests/test_memory_summary.py`)."""

import json
import random
from pathlib import Path

from cs336sys.profiling.memory import CPU_SOURCE, summarize_snapshot

EXPECTED = Path(__file__).parent / "data" / "memory_summary_synthetic.json"
PHASES = ("forward", "backward", "optimizer_step")


def _frames(rng: random.Random) -> list[dict]:
    """A stack of one of a dozen Python sites outside cs336sys (their labels do not read source lines),
    an autograd node's C++ frames, or none."""
    kind = rng.randrange(14)
    if kind < 12:
        return [{"filename": f"/elsewhere/site{kind}.py", "line": 10 + kind, "name": f"f{kind}"},
                {"filename": "/elsewhere/caller.py", "line": 7, "name": "call"}]
    if kind == 12:
        return [{"filename": "??", "line": 0, "name": "torch::autograd::generated::MmBackward0::apply(...)"}]
    return []


def synthetic_snapshot(seed: int = 0, events: int = 250) -> dict:
    """Allocations and frees at random with their phases, some blocks freed that were allocated before
    recording, segment events, and blocks alive before recording that no event names."""
    rng = random.Random(seed)
    trace, alive, addr = [], {}, 10_000
    for i in range(events):
        phase = PHASES[min(2, 3 * i // events)]
        if alive and rng.random() < 0.45:
            a = rng.choice(sorted(alive))
            size, frames = alive.pop(a)
            for action in ("free_requested", "free_completed"):
                trace.append({"action": action, "addr": a, "size": size, "frames": frames, "user_metadata": phase})
        elif rng.random() < 0.05:  # a block allocated before recording began
            trace.append({"action": "free_completed", "addr": rng.randrange(100, 9000),
                          "size": 512 * rng.randrange(1, 9), "frames": [], "user_metadata": phase})
        elif rng.random() < 0.05:
            trace.append({"action": rng.choice(("segment_alloc", "segment_free")), "addr": 0,
                          "size": 2**20 * rng.randrange(1, 4), "frames": [], "user_metadata": phase})
        else:
            addr += 4096
            size, frames = 512 * rng.randrange(1, 64), _frames(rng)
            alive[addr] = (size, frames)
            trace.append({"action": "alloc", "addr": addr, "size": size, "frames": frames,
                          "user_metadata": "" if rng.random() < 0.1 else phase})
    blocks = [{"address": a, "size": size, "state": "active_allocated", "frames": frames}
              for a, (size, frames) in sorted(alive.items())]
    blocks += [{"address": 50, "size": 2048, "state": "active_allocated", "frames": []},
               {"address": 2098, "size": 4096, "state": "inactive"}]
    segments = [{"device": 0, "address": 0, "total_size": 64 * 2**20, "blocks": blocks},
                {"device": 1, "address": 0, "total_size": 2**20, "blocks": []}]
    return {"segments": segments, "device_traces": [trace, trace[:5]]}


def summaries() -> dict:
    """The summaries the test compares: default arguments, sampled with few categories, and as a CPU snapshot."""
    cpu = synthetic_snapshot(seed=1) | {"source": CPU_SOURCE}
    return {"default": summarize_snapshot(synthetic_snapshot()),
            "sampled": summarize_snapshot(synthetic_snapshot(), max_points=23, top_categories=4, top_allocations=5),
            "cpu": summarize_snapshot(cpu, device=0)}


def test_summary_json_is_unchanged():
    got = json.loads(json.dumps(summaries()))
    assert got == json.loads(EXPECTED.read_text())


if __name__ == "__main__":
    EXPECTED.write_text(json.dumps(summaries(), sort_keys=True) + "\n")
    print(f"wrote {EXPECTED}")
