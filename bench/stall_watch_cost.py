"""CPU cost of the stall watch thread ("gpuprof-stalls": late wake-ups every tick, the CPU wait
of the process's threads every fourth): its on-CPU time (schedstat) over 10 s of an otherwise
idle profile. Run: .venv/bin/python bench/stall_watch_cost.py"""

import os
import tempfile
import time

import gpuprof


def thread_cpu(name):
    """(seconds on CPU, tid) of this process's thread named `name`."""
    for tid in os.listdir("/proc/self/task"):
        try:
            if open(f"/proc/self/task/{tid}/comm").read().strip() == name:
                return int(open(f"/proc/self/task/{tid}/schedstat").read().split()[0]) / 1e9, tid
        except OSError:
            pass
    return None, None


with tempfile.TemporaryDirectory() as d:
    with gpuprof.profile("cost", db=os.path.join(d, "cost.db"), auto=False, gpu="none",
                         summary=False):
        time.sleep(0.2)
        c0, tid = thread_cpu("gpuprof-stalls")
        t0 = time.monotonic()
        time.sleep(10)
        c1, _ = thread_cpu("gpuprof-stalls")
        wall = time.monotonic() - t0
print(f"stall watch thread {tid}: {c1 - c0:.3f} s CPU over {wall:.1f} s = "
      f"{100 * (c1 - c0) / wall:.3f}% of a core")
