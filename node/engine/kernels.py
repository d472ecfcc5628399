"""Which CPU kernels the engine runs: the kernel probe, its cached verdict, and the report.

llama.cpp can move weights into "extra buffer types" at load: AMX tiles on Intel CPUs that
list AMX, and CPU repacking into interleaved layouts (x86 AVX2/AVX-512, aarch64 NEON,
dotprod, i8mm, SVE). They are usually faster, but some virtual machines list AMX in CPUID and
then trap its tile instructions: the first batched decode dies by SIGILL, taking the whole
process with it. So before a model is loaded for serving, `choose_kernels` asks a child
process (node/engine/kernel_probe.py) to load it without and then with extra buffer types
and time batched decodes with logits on every row:

  - the child died by a signal, timed out or failed with them on: they are off, and the log
    says so once, naming the signal;
  - both ran: the faster way is kept (one-token step plus an eight-row step, medians), where
    it is faster by more than `CLOSE_CALL`; closer than that, llama.cpp's default (on) stays.
    Two ways that close are what a busy or shared host's noise tells apart: a probe run while
    the test suite ran on both cores of an AMD EPYC said "off is faster (1 + 8 rows: 58.8 ms
    with, 56.7 ms without)", the same build on the quiet host "on is faster (25.6 ms with,
    26.6 ms without)", and the verdict is kept for every later start.

The verdict is cached under `<home>/kernels/`, keyed by the CPU's flags, the kernel release,
the llama.cpp build (version, library file, system info), the model file (path, size,
modification time) and the thread count, so later starts cost nothing. `setting` "on" or
"off" (`[model] extra_buffers`) skips the probe.

`KernelChoice.report()` is what the start-up line, /health, /metrics and every benchmark
header show: the CPU features llama.cpp uses, whether extra buffers are in use and why, the
buffer types the weights went to, and the step cost line the probe measured.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import orjson

from node.engine.cost_line import CostLine, fit_samples

log = logging.getLogger(__name__)

SETTINGS = ("auto", "on", "off")
PROBE_TIMEOUT_S = 60.0
CLOSE_CALL = 0.05  # without extra buffers faster by at most this share: llama.cpp's default stays
VERDICT_VERSION = 2  # 2: close calls keep the default (CLOSE_CALL); verdicts of 1 are probed again


@dataclass(frozen=True, slots=True)
class KernelChoice:
    extra_buffers: bool            # what the model is loaded with
    setting: str                   # auto | on | off
    reason: str                    # why, in words
    usable: bool | None = None     # extra buffers ran a batched decode in the probe (None: not probed)
    cached: bool = False           # the verdict came from <home>/kernels
    probe_s: float = 0.0           # wall time of the probe (0 when cached or set)
    line: CostLine | None = None   # the probe's cost line for the chosen way
    buffers: dict[str, float] = field(default_factory=dict)  # the chosen way's buffer types (MiB)
    timed_out: bool = False        # the probe ran out of time: a busy host, not a verdict to keep
    huge_mib: float | None = None  # the probe's weights in 2 MiB pages (None: not asked for)

    def report(self, system_info: str, buffers: dict[str, float] | None = None, variant: str | None = None,
               huge_mib: float | None = None) -> dict:
        """The kernel path as /health shows it; `buffers` from the engine's own load when known;
        `variant` the CPU variant a runtime-dispatch build loaded (None: the backend is built in);
        `huge_mib` the weights in 2 MiB pages (None: not asked for)."""
        features = [part.split("=")[0].strip() for part in system_info.replace("|", "\n").splitlines()
                    if part.strip().endswith("= 1")]
        return {
            "machine": platform.machine(),
            "cpu_variant": variant,
            "features": [name.replace("CPU : ", "") for name in features],
            "extra_buffers": "on" if self.extra_buffers else "off",
            "setting": self.setting,
            "reason": self.reason,
            "buffers": {name: round(mib, 1) for name, mib in (buffers if buffers is not None else self.buffers).items()},
            "huge_pages_mib": round(huge_mib, 1) if huge_mib is not None else None,
            "probe_line_ms": self.line.as_dict() if self.line else None,
            "probe_seconds": round(self.probe_s, 2),
            "cached": self.cached,
            "system_info": system_info,
        }


def describe(report: Mapping[str, Any], line_ms: Mapping[str, float] | None = None) -> str:
    """The kernel path and the cost line on one line: the start-up log and every bench header."""
    buffers = ", ".join(f"{name} {mib:.0f} MiB" for name, mib in report.get("buffers", {}).items()) or "unknown"
    variant = f" (CPU variant {report['cpu_variant']})" if report.get("cpu_variant") else ""
    text = (f"{report.get('machine', '?')}{variant} {' '.join(report.get('features', ())) or '(no SIMD features)'}; "
            f"extra buffers {report.get('extra_buffers', '?')} ({report.get('reason', '')}); weights in {buffers}")
    if report.get("huge_pages_mib") is not None:
        text += f" ({report['huge_pages_mib']:.0f} MiB in huge pages)"
    line = line_ms if line_ms is not None else report.get("probe_line_ms")
    if line:
        text += (f"; cost line {line['per_step']:.1f} ms + {line['per_token']:.2f} ms per token with logits "
                 f"(a row is {line['row_share']:.2f} of a one-token step)")
    return text


def default_cache_dir() -> Path:
    from shared.config import home_dir

    return home_dir(os.environ) / "kernels"


def cpu_flags() -> str:
    """The CPU's feature list as the kernel reports it (x86 `flags`, aarch64 `Features`)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip().lower() in ("flags", "features"):
                    return " ".join(sorted(value.split()))
    except OSError:
        pass
    return platform.processor() or platform.machine()


def llama_build() -> str:
    """What identifies the llama.cpp build: version, shared library (size, mtime), system info."""
    import llama_cpp

    from node.engine.llama import system_info

    parts = [getattr(llama_cpp, "__version__", "?"), system_info()]
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    for lib in sorted(lib_dir.glob("*.so*")) if lib_dir.is_dir() else ():
        stat = lib.stat()
        parts.append(f"{lib.name}:{stat.st_size}:{stat.st_mtime_ns}")
    return "\n".join(parts)


def verdict_key(model_path: Path, n_threads: int) -> str:
    stat = Path(model_path).stat()
    uname = os.uname()
    text = "\n".join([
        f"v{VERDICT_VERSION}", uname.machine, uname.release, cpu_flags(), llama_build(),
        f"{Path(model_path).resolve()}:{stat.st_size}:{stat.st_mtime_ns}", f"threads {n_threads}",
    ])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def choose_kernels(model_path: Path, *, setting: str = "auto", cache_dir: Path | None = None,
                   n_threads: int = 0, timeout_s: float = PROBE_TIMEOUT_S) -> KernelChoice:
    """Whether to load `model_path` with extra buffer types, and why."""
    if setting not in SETTINGS:
        raise ValueError(f"extra_buffers must be one of {', '.join(SETTINGS)}, got {setting!r}")
    if setting != "auto":
        return KernelChoice(setting == "on", setting, f"set to {setting}")
    n_threads = n_threads or os.cpu_count() or 1
    directory = cache_dir if cache_dir is not None else default_cache_dir()
    path = directory / f"{verdict_key(model_path, n_threads)}.json"
    cached = _read_verdict(path)
    if cached is not None:
        log.info("kernels: extra buffer types %s (%s; cached verdict)", "on" if cached.extra_buffers else "off",
                 cached.reason)
        return cached
    choice = probe_kernels(model_path, n_threads=n_threads, timeout_s=timeout_s)
    if choice.usable is False and not choice.timed_out:
        log.warning("kernels: %s; loading without extra buffer types (AMX, CPU repack)", choice.reason)
    else:
        log.info("kernels: extra buffer types %s (%s; probe %.1f s)", "on" if choice.extra_buffers else "off",
                 choice.reason, choice.probe_s)
    if choice.timed_out:  # nothing crashed: off for this start, probed again at the next
        log.warning("kernels: the probe timed out after %.0f s (a busy host?); without extra buffer types "
                    "this time, probing again at the next start", timeout_s)
    else:
        _write_verdict(path, choice)
    return choice


def probe_kernels(model_path: Path, *, n_threads: int, timeout_s: float = PROBE_TIMEOUT_S,
                  modes: str = "off,on", repeats: int = 5, huge_pages: bool = False) -> KernelChoice:
    """Run the probe child and judge what it printed and how it ended."""
    command = [sys.executable, "-m", "node.engine.kernel_probe", str(model_path), "--modes", modes,
               "--threads", str(n_threads), "--repeats", str(repeats), *(["--huge-pages"] if huge_pages else [])]
    root = Path(__file__).resolve().parents[2]  # the checkout or site-packages holding `node`
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, timeout=timeout_s, env=env, check=False)
        stdout, returncode, ended = done.stdout, done.returncode, ""
    except subprocess.TimeoutExpired as exc:
        stdout, returncode, ended = exc.stdout or b"", None, f"timed out after {timeout_s:.0f} s"
    elapsed = time.perf_counter() - start
    results: dict[str, dict] = {}
    for raw in stdout.splitlines():
        try:
            line = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if isinstance(line, dict) and line.get("mode") in ("on", "off"):
            results[line["mode"]] = line
    if returncode is not None and returncode < 0:
        ended = f"died by {_signal_name(-returncode)}"
    elif returncode not in (None, 0):
        ended = f"exited with status {returncode}"
    on, off = results.get("on"), results.get("off")
    on_line, off_line = _line(on), _line(off)
    if "on" not in modes.split(","):  # a measurement of one way (a bench's header), no verdict
        why = "" if off_line is not None else f": {(off or {}).get('error') or ended or 'printed nothing'}"
        return KernelChoice(False, "auto", f"measured without extra buffer types{why}", probe_s=elapsed,
                            line=off_line, buffers=_buffers(off), timed_out=returncode is None,
                            huge_mib=_huge_mib(off))
    if on_line is None:
        why = (on or {}).get("error") or ended or "printed nothing"
        where = "the probe's batched decode with extra buffer types"
        return KernelChoice(False, "auto", f"{where} {why}", usable=False, probe_s=elapsed,
                            line=off_line, buffers=_buffers(off), timed_out=returncode is None)
    if off_line is None:  # extra buffers run; without them the probe failed: keep what runs
        return KernelChoice(True, "auto", "extra buffer types ran; the probe without them failed", usable=True,
                            probe_s=elapsed, line=on_line, buffers=_buffers(on), huge_mib=_huge_mib(on))
    keep_on, reason = judge(on_line, off_line)
    chosen = on if keep_on else off
    return KernelChoice(keep_on, "auto", reason, usable=True, probe_s=elapsed,
                        line=on_line if keep_on else off_line, buffers=_buffers(chosen),
                        huge_mib=_huge_mib(chosen))


def judge(on_line: CostLine, off_line: CostLine) -> tuple[bool, str]:
    """Whether extra buffer types stay on, from the two ways' measured lines (a one-token step
    plus an eight-row step), and why: off only where it is faster by more than CLOSE_CALL."""
    on_cost, off_cost = on_line.seconds(1) + on_line.seconds(8), off_line.seconds(1) + off_line.seconds(8)
    rows = f"1 + 8 rows: {on_cost * 1000:.1f} ms with, {off_cost * 1000:.1f} ms without"
    if on_cost <= off_cost:
        return True, f"probe: on is faster ({rows})"
    if off_cost * (1 + CLOSE_CALL) >= on_cost:
        return True, f"probe: within {CLOSE_CALL:.0%}, llama.cpp's default ({rows})"
    return False, f"probe: off is faster ({rows})"


def _line(result: dict | None) -> CostLine | None:
    if not result or "samples" not in result:
        return None
    samples = {int(size): values for size, values in result["samples"].items()}
    return fit_samples(samples)


def _buffers(result: dict | None) -> dict[str, float]:
    return dict((result or {}).get("buffers") or {})


def _huge_mib(result: dict | None) -> float | None:
    return (result or {}).get("huge_mib")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _read_verdict(path: Path) -> KernelChoice | None:
    try:
        data = orjson.loads(path.read_bytes())
        line = data.get("line")
        return KernelChoice(
            extra_buffers=bool(data["extra_buffers"]), setting="auto", reason=str(data["reason"]),
            usable=data.get("usable"), cached=True,
            line=CostLine(float(line["per_step"]), float(line["per_token"])) if line else None,
            buffers={str(k): float(v) for k, v in (data.get("buffers") or {}).items()})
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:  # damaged: probe again
        log.warning("kernels: ignoring unreadable verdict %s (%s)", path, exc)
        return None


def _write_verdict(path: Path, choice: KernelChoice) -> None:
    record = {"extra_buffers": choice.extra_buffers, "reason": choice.reason, "usable": choice.usable,
              "line": {"per_step": choice.line.per_step, "per_token": choice.line.per_token} if choice.line else None,
              "buffers": choice.buffers, "probed_at": time.time()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_suffix(f".tmp{os.getpid()}")
        temp.write_bytes(orjson.dumps(record))
        os.replace(temp, path)
    except OSError as exc:  # a read-only home: probe again next start
        log.warning("kernels: could not cache the verdict in %s (%s)", path.parent, exc)
