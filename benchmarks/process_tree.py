"""One way to time a command and measure its memory: run it, sample the resident memory of its whole process
tree (the command and every descendant: Ray workers, SuperNodes, ClientApps) every ``interval`` seconds.
The sum of RSS counts shared library pages once per process, so it over-states what processes share; the
machine's own count of memory in use (total less available, its growth since the command started) does not,
but counts whatever else the machine runs meanwhile: run it on a quiet machine."""
from __future__ import annotations

import subprocess
import time


def run_sampled(cmd: list[str], interval: float = 0.25, **popen) -> dict:
    """Run ``cmd`` (``subprocess.Popen`` keywords in ``popen``) to its end; returns ``returncode``,
    ``wall_seconds``, ``peak_rss_mb`` (the largest sampled sum of RSS over the process tree) and
    ``peak_used_mb`` (the largest sampled growth of the machine's memory in use since the start)."""
    import psutil

    def used() -> int:
        memory = psutil.virtual_memory()
        return memory.total - memory.available

    start, before, peak_used = time.perf_counter(), used(), 0
    proc = subprocess.Popen(cmd, **popen)
    root = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        rss = 0
        try:
            tree = [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            tree = []
        for p in tree:
            try:
                rss += p.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        peak, peak_used = max(peak, rss), max(peak_used, used() - before)
        time.sleep(interval)
    return {"returncode": proc.returncode, "wall_seconds": time.perf_counter() - start, "peak_rss_mb": peak / 2**20,
            "peak_used_mb": peak_used / 2**20}
