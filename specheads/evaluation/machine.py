"""What the card and the host ran at, read after a timed run: a benchmark's runs can drift over a process
(on an H100 at batch 1 an engine run later in one process ran about 1% slower than the one before it,
2026-12-06), and these say whether the machine's clocks moved with them (scripts/bench.py, `specheads
evaluate`)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def machine_state() -> dict:
    """The card's SM clock (MHz), temperature (C) and power (W) from nvidia-smi where there is one, and
    the host's mean core clock (MHz) from /proc/cpuinfo where it tells one; read outside a run's clock."""
    state = {}
    try:
        line = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,temperature.gpu,power.draw",
                               "--format=csv,noheader,nounits", "-i", "0"], capture_output=True, text=True,
                              timeout=5).stdout.strip().splitlines()
        sm, temp, power = (float(x) for x in line[0].split(","))
        state.update(card_sm_mhz=sm, card_temp_c=temp, card_power_w=power)
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        pass
    try:
        mhz = [float(x.split(":")[1]) for x in Path("/proc/cpuinfo").read_text().splitlines()
               if x.startswith("cpu MHz")]
        if mhz:
            state["host_mhz"] = round(sum(mhz) / len(mhz), 1)
    except (OSError, ValueError, IndexError):
        pass
    return state
