"""The bench's worker processes: each case in a fresh ``attnlab.bench.worker`` process (so peak memory is its
own), Ctrl-C's stop of them all, and the memory free for them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any


def available_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux), else total physical memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


_CHILDREN: set[subprocess.Popen[str]] = set()  # the worker processes running now (two threads may start them)
_CHILDREN_LOCK = threading.Lock()


def _spawn(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "attnlab.bench.worker", json.dumps(spec)]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        with _CHILDREN_LOCK:
            _CHILDREN.add(proc)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return {**spec, "status": f"failed: exceeded {timeout:.0f} s"}
        except BaseException:  # Ctrl-C in this thread: the worker goes too
            proc.kill()
            raise
        finally:
            with _CHILDREN_LOCK:
                _CHILDREN.discard(proc)
    if proc.returncode != 0:
        tail = (err or "").strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        return {**spec, "status": f"failed: {tail[0][:200]}"}
    answer: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return answer


def stop_workers() -> None:
    """Kill every worker process running now (Ctrl-C: the threads waiting on them then return)."""
    with _CHILDREN_LOCK:
        for proc in _CHILDREN:
            proc.kill()


Worker = Callable[[dict[str, Any], float], dict[str, Any]]
