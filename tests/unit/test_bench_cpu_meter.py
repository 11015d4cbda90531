"""The bench's CPU meter (`tools/bench/processes.py`) on real processes: what it reads, not
how fast anything runs (the bench reports figures, it never asserts them)."""

from __future__ import annotations

import os
import subprocess

from tools.bench.processes import CpuMeter


def test_the_cpu_meter_counts_a_process_s_reaped_commands_apart_from_itself() -> None:
    """A worker's own CPU leaves out the sandboxed commands it runs; the meter shows them as
    `<name> commands` (what the kernel adds to the parent once it has waited for them)."""
    meter = CpuMeter({"me": os.getpid()}, with_reaped=("me",))
    before = meter.snapshot()
    busy = "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"
    subprocess.run(["/bin/sh", "-c", busy], check=True)
    after = meter.snapshot()
    per_item = CpuMeter.per_item(before, after, 1, ("me",))
    assert set(per_item) == {"me", "me commands"}
    assert per_item["me commands"] > 0  # the shell's loop, not this process's wait
