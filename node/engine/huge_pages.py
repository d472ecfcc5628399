"""2 MiB pages for the model's weights (Linux transparent huge pages).

A decode step reads every weight once; with 4 KiB pages the 4-row tiles of llama.cpp's matrix
kernels miss the TLB at every page they start. On a 2-vCPU Xeon (docs/BENCHMARKS.md, "The
weights in 2 MiB pages") steps of 2 to 12 rows with logits ran 9-15% faster with the weights
in 2 MiB pages, one-row steps and prompt chunks the same. llama.cpp maps the model file
(page cache: 4 KiB pages) or reads it into memory it allocates, and asks for huge pages
neither way; where the kernel gives them only on request (`madvise` mode), nothing does.

This module owns: whether the kernel offers them (`offered`, `wanted`), the anonymous
mappings a model load created (`anonymous_mappings` before and after) and of those the ones
holding its weight buffers (`holding`), and moving those into
huge pages: madvise(MADV_HUGEPAGE) so that they stay so, then madvise(MADV_COLLAPSE), which
copies them into huge pages at once instead of leaving it to khugepaged's slow scan (Linux
6.1 and later; where it is refused, the first call stands and khugepaged collapses them in
its time). `collapse` says how
much of them is in huge pages (/proc/self/smaps) and what it took.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from node.engine.errors import ModelLoadError

log = logging.getLogger(__name__)

THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
HPAGE_PMD_SIZE = Path("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")
HUGE = 2 << 20                 # the huge page size where the kernel does not say (x86-64; arm64 with 4 KiB pages)
MIN_MAPPING = 4 << 20          # smaller new mappings are not worth a huge page
CHUNK = 64 << 20               # MADV_COLLAPSE per call: a long copy never holds the mm for long
MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25
SETTINGS = ("auto", "on", "off")
UNCOLLAPSED = "MADV_COLLAPSE refused (a kernel before 6.1?): left to khugepaged's scan"

Mapping = tuple[int, int]      # [start, end) of one mapping


@dataclass(frozen=True, slots=True)
class Collapsed:
    """What `collapse` did to the mappings a load created."""

    mapped: int                # bytes of the new anonymous mappings
    huge: int                  # bytes of them in huge pages afterwards
    seconds: float
    note: str = ""             # why less than all, if so
    page: int = HUGE           # the huge page size

    def describe(self) -> str:
        text = (f"{self.huge / 2**20:.0f} of {self.mapped / 2**20:.0f} MiB in {self.page >> 20} MiB pages "
                f"({self.seconds:.2f} s)")
        return f"{text}; {self.note}" if self.note else text


def page_size(path: Path = HPAGE_PMD_SIZE) -> int:
    """The size of the huge pages the kernel collapses into (2 MiB on x86-64, 512 MiB on an
    arm64 kernel with 64 KiB pages)."""
    try:
        size = int(path.read_text().strip())
    except (OSError, ValueError):
        return HUGE
    return size if size > 0 and size & (size - 1) == 0 else HUGE


def thp_mode(path: Path = THP_ENABLED) -> str:
    """The kernel's transparent huge page mode (`always`, `madvise`, `never`), "" where it has none."""
    try:
        text = path.read_text()
    except OSError:
        return ""
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else ""


def offered(path: Path = THP_ENABLED) -> bool:
    return sys.platform.startswith("linux") and thp_mode(path) in ("always", "madvise")


def file_size(path: str | os.PathLike[str]) -> int:
    """A model file's bytes (0 where it cannot be read: the load says why)."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def available_ram(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """MemAvailable in bytes, None where the kernel does not say."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def wanted(setting: str, model_bytes: int = 0, path: Path = THP_ENABLED,
           meminfo: Path = Path("/proc/meminfo")) -> bool:
    """The `[memory] huge_pages` setting resolved for a model of `model_bytes`: auto = where the
    kernel offers them and the model takes at most half the RAM available (read weights are
    the node's own memory, which the kernel cannot drop and read again from the file as it
    can a mapping's pages: a tight box keeps the mapping); on where the kernel offers none is
    an error, not a quiet fallback."""
    if setting not in SETTINGS:
        raise ModelLoadError(f"huge_pages must be one of {', '.join(SETTINGS)}, got {setting!r}")
    if setting == "off":
        return False
    if not offered(path):
        if setting == "on":
            mode = thp_mode(path) or f"no {path}"
            raise ModelLoadError(f"huge_pages = on, but this kernel offers no transparent huge pages ({mode})")
        return False
    if setting == "on":
        return True
    available = available_ram(meminfo)
    if available is not None and 2 * model_bytes > available:
        log.info("weights mapped, not in huge pages: the model (%d MiB) is more than half the RAM available "
                 "(%d MiB)", model_bytes >> 20, available >> 20)
        return False
    return True


def anonymous_mappings(maps: Path = Path("/proc/self/maps")) -> set[Mapping]:
    """The process's private writable mappings with no file behind them."""
    found: set[Mapping] = set()
    try:
        lines = maps.read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 5 or not fields[1].startswith("rw") or fields[1][3] != "p":
            continue
        if len(fields) == 6 and fields[5].strip():  # a file, [heap], [stack], ...
            continue
        start, _, end = fields[0].partition("-")
        found.add((int(start, 16), int(end, 16)))
    return found


def holding(mappings: set[Mapping], sizes: list[int], slack: int = 4 << 20) -> set[Mapping]:
    """Of the mappings a load created, those holding buffers of `sizes` bytes (llama.cpp's
    weight buffers, as its load reports them): for each size, the smallest mapping at least
    that large and at most `slack` larger. Other allocations the load made (the vocabulary's
    tables, another thread's) are left as they are."""
    found: set[Mapping] = set()
    for size in sorted(sizes, reverse=True):
        fits = [m for m in mappings - found if size - (64 << 10) <= m[1] - m[0] <= size + slack]
        if fits:
            found.add(min(fits, key=lambda m: m[1] - m[0]))
    return found


def huge_bytes(ranges: list[Mapping], smaps: Path = Path("/proc/self/smaps")) -> int:
    """Bytes of `ranges` in huge pages, from the smaps entries that lie inside them."""
    total = 0
    inside = False
    try:
        lines = smaps.read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        head = line.split(maxsplit=1)[0] if line else ""
        if "-" in head and not head.endswith(":"):
            start, _, end = head.partition("-")
            try:
                lo, hi = int(start, 16), int(end, 16)
            except ValueError:
                continue
            inside = any(a <= lo and hi <= b for a, b in ranges)
        elif inside and head == "AnonHugePages:":
            total += int(line.split()[1]) * 1024
    return total


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    libc.madvise.restype = ctypes.c_int
    return libc


def collapse(mappings: set[Mapping]) -> Collapsed:
    """Move the anonymous mappings (those a model load created) into huge pages."""
    began = time.perf_counter()
    ranges: list[Mapping] = []
    huge = page_size()
    for start, end in sorted(mappings):
        lo, hi = (start + huge - 1) // huge * huge, end // huge * huge
        if hi - lo >= max(MIN_MAPPING, huge):
            ranges.append((lo, hi))
    if not ranges:
        return Collapsed(0, 0, 0.0, "no new mapping of a huge page or more", huge)
    libc = _libc()
    note = ""
    for lo, hi in ranges:
        if libc.madvise(lo, hi - lo, MADV_HUGEPAGE) != 0:
            note = f"MADV_HUGEPAGE: {os.strerror(ctypes.get_errno())}"
            break
        for at in range(lo, hi, CHUNK):
            if libc.madvise(at, min(CHUNK, hi - at), MADV_COLLAPSE) == 0:
                continue
            code = ctypes.get_errno()
            if code == errno.EINVAL:  # a kernel before 6.1, or a mapping it will not collapse now
                note = UNCOLLAPSED
                break
            note = f"MADV_COLLAPSE: {os.strerror(code)}"  # EAGAIN / ENOMEM: no free huge page now
    return Collapsed(sum(hi - lo for lo, hi in ranges), huge_bytes(ranges), time.perf_counter() - began, note, huge)
