"""llama.cpp's OpenMP workers in a process that opens more than one engine.

llama.cpp's CPU backend built with OpenMP (libgomp) keeps a team of worker threads for each
thread that decodes, for as long as that thread lives, idle or not. Once the teams' threads
outnumber the cores, libgomp stops spinning at its barriers and sleeps at each instead, and a
step meets a barrier after every graph node: on a 2-core host, with a second engine open and
idle, 32 greedy tokens took 417 ms against 241 ms alone (a raw context decoding from a second
thread: 27-40 ms for a 28-token step against 21).

A node runs one engine, and nothing here acts for it. Where a process opens more (benchmarks,
tests, a program embedding engines), an engine that goes idle while another is open lets its
team go (`release`: libgomp's `omp_pause_resource_all`), and an engine that opens wakes the
others so that the idle ones do so at once. The next step of an engine that let its team go
builds it again (about 14 ms more, median, on that host): one engine alone keeps its team.
Two engines decoding at the same moment still share the cores, as any two programs would.

This module owns the register of open engines (`opened`, `closed`, `shared`), `release` and
the engines' idle hook (`when_idle`).
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from typing import Callable

OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: the threads go, the library stays initialised

_lock = threading.Lock()
_open: dict[int, Callable[[], None]] = {}  # engine key -> wakes its scheduler


def opened(key: int, wake: Callable[[], None]) -> int:
    """Register an engine (its `wake` rouses its idle scheduler); wake the others, so that an
    idle one lets its team go now. Returns how many others are open."""
    with _lock:
        others = list(_open.values())
        _open[key] = wake
    for other in others:
        other()
    return len(others)


def closed(key: int) -> None:
    with _lock:
        _open.pop(key, None)


def open_engines() -> int:
    with _lock:
        return len(_open)


def shared() -> bool:
    """More than one engine of this process is open."""
    return open_engines() > 1


@functools.cache
def _pause() -> Callable[[int], int] | None:
    """libgomp's omp_pause_resource_all where llama.cpp loaded it (never loaded here otherwise)."""
    try:
        lib = ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        pause = lib.omp_pause_resource_all
    except (OSError, AttributeError):
        return None
    pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
    return pause


def release() -> bool:
    """Let the calling thread's OpenMP team go (its workers end; the thread's next decode builds
    a new one). False where llama.cpp runs without libgomp or libgomp refused (inside a parallel
    region)."""
    pause = _pause()
    return pause is not None and pause(OMP_PAUSE_SOFT) == 0


def when_idle() -> None:
    """On an engine's thread as it goes idle: let its team go while another engine is open."""
    if shared():
        release()
