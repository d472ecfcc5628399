"""Every module of arca, node and shared imports on its own, and the layers import one way.

`test_every_module_imports_alone` imports each module first in a fresh interpreter: one
subprocess imports the third-party libraries (so each check costs milliseconds, not the
second numpy and llama.cpp take to load) and then forks one child per module, which
imports that module and nothing else of the project first. A circular import that only
works when some other module happens to be imported first fails here.

`test_layers_import_one_way` reads the sources (a static scan of `import` statements, lazy
ones inside functions included) and checks the directions the design fixes: arca never
imports node, llama_cpp or aiohttp; node/serving and node/engine never import aiohttp (and
serving never llama_cpp); node/batches never imports aiohttp or the API; the lower node
packages never import the ones above them, nor node/assembly.py (the one place a node is
wired, above all of them but the API and the CLI).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("arca", "node", "shared")
THIRD_PARTY = ("numpy", "orjson", "hiredis", "zstandard", "rich", "aiohttp", "redis", "prometheus_client",
               "jinja2", "tqdm", "llama_cpp", "uvloop", "llguidance", "jsonschema")

CHILD = r"""
import importlib, os, sys, traceback
for lib in sys.argv[1].split(","):
    try:
        importlib.import_module(lib)
    except ImportError:
        pass
failures = []
for name in sys.argv[2:]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            importlib.import_module(name)
            code = 0
        except BaseException:
            os.write(write, traceback.format_exc().encode())
            code = 1
        os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        detail = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    if status:
        failures.append(name + ": " + (detail.strip().splitlines()[-1] if detail else f"status {status}"))
print("\n".join(failures))
sys.exit(1 if failures else 0)
"""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def all_modules() -> list[str]:
    return [module_name(path) for package in PACKAGES for path in sources(package)]


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
@pytest.mark.slow  # a fresh interpreter per module
def test_every_module_imports_alone():
    modules = all_modules()
    assert len(modules) > 50 and "node.serving.service" in modules
    done = subprocess.run([sys.executable, "-c", CHILD, ",".join(THIRD_PARTY), *modules], cwd=ROOT,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"modules that do not import alone:\n{done.stdout}{done.stderr[-2000:]}"


def imported(path: Path) -> set[str]:
    """Every module name an import statement of the file names (relative imports resolved)."""
    names: set[str] = set()
    package = module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else module_name(path)
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def offenders(package: str, forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for path in sources(package):
        for name in imported(path):
            if any(name == bad or name.startswith(bad + ".") for bad in forbidden):
                found.append(f"{path.relative_to(ROOT)} imports {name}")
    return sorted(found)


@pytest.mark.parametrize("package, forbidden", [
    ("arca", ("node", "llama_cpp", "aiohttp")),
    ("shared", ("arca", "node", "llama_cpp", "aiohttp")),
    ("node/engine", ("aiohttp", "node.api", "node.serving", "node.sessions", "node.models", "node.archive",
                     "node.cache", "node.speculative")),
    ("node/batches", ("aiohttp", "llama_cpp", "node.api")),
    ("node/speculative", ("aiohttp", "llama_cpp", "node.api", "node.serving", "node.sessions", "node.models",
                          "node.archive", "node.cache", "node.batches")),
    ("node/serving", ("aiohttp", "llama_cpp", "node.api", "node.batches")),
    ("node/serving/conclave", ("aiohttp", "llama_cpp", "node.api", "node.sessions", "node.archive", "node.cache",
                               "node.models", "node.serving.answer", "node.batches")),
    ("node/sessions", ("aiohttp", "llama_cpp", "node.api", "node.serving", "node.batches")),
    ("node/archive", ("aiohttp", "llama_cpp", "node.api", "node.serving", "node.sessions", "node.engine")),
    ("node/cache", ("aiohttp", "node.api", "node.serving", "node.sessions", "node.models")),
    ("node/models", ("node.api", "node.serving", "node.sessions", "node.cache", "node.speculative",
                     "node.archive", "node.assembly")),
    ("node/serving", ("node.assembly",)),
    ("node/sessions", ("node.assembly",)),
    ("node/archive", ("node.assembly",)),
    ("node/cache", ("node.assembly",)),
])
def test_layers_import_one_way(package, forbidden):
    assert offenders(package, forbidden) == []


def test_the_scan_sees_lazy_imports():
    sample = ROOT / "node" / "assembly.py"
    assert "node.engine.engine" in imported(sample)  # imported inside a function
