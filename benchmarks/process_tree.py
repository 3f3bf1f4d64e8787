"""One way to time a command and measure its memory: run it, sample the resident memory of its whole process
tree (the command and every descendant: Ray workers, SuperNodes, ClientApps) every ``interval`` seconds.
The sum of RSS counts shared library pages once per process, so it over-states what processes share."""
from __future__ import annotations

import subprocess
import time


def run_sampled(cmd: list[str], interval: float = 0.25, **popen) -> dict:
    """Run ``cmd`` (``subprocess.Popen`` keywords in ``popen``) to its end; returns ``returncode``,
    ``wall_seconds`` and ``peak_rss_mb`` (the largest sampled sum of RSS over the process tree)."""
    import psutil

    start = time.perf_counter()
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
        peak = max(peak, rss)
        time.sleep(interval)
    return {"returncode": proc.returncode, "wall_seconds": time.perf_counter() - start, "peak_rss_mb": peak / 2**20}
