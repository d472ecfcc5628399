"""The node image's llama.cpp build as the Dockerfile states it, without building anything.

The Dockerfile's CMAKE_ARGS select llama.cpp's runtime CPU dispatch (one CPU backend per ISA
level, the best loaded at run time) and install those variants beside libllama.so, where the
node loads them from; deploy/wheels/README.md and docs/FLEET.md give the very same arguments,
so a wheel built by following them is one the image's build check accepts.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def image_cmake_args() -> str:
    match = re.search(r'^ARG CMAKE_ARGS="([^"]*)"$', (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    assert match, "the Dockerfile declares no ARG CMAKE_ARGS"
    return match.group(1)


def squeezed(text: str) -> str:
    return " ".join(text.split())


def test_cmake_args_select_runtime_cpu_dispatch() -> None:
    flags = dict(arg[2:].split("=", 1) for arg in shlex.split(image_cmake_args()))
    assert flags["GGML_BACKEND_DL"] == "ON"
    assert flags["GGML_CPU_ALL_VARIANTS"] == "ON"
    assert flags["GGML_NATIVE"] == "OFF"  # llama.cpp refuses GGML_NATIVE with GGML_BACKEND_DL
    assert flags["CMAKE_INSTALL_BINDIR"] == "llama_cpp/lib"  # else the variants miss llama_cpp/lib


def test_wheel_readme_and_fleet_docs_give_the_image_cmake_args() -> None:
    args = image_cmake_args()
    readme = squeezed((ROOT / "deploy/wheels/README.md").read_text().replace("\\\n", " "))
    assert f'CMAKE_ARGS="{args}"' in readme
    assert f'CMAKE_ARGS="{args}"' in squeezed((ROOT / "docs/FLEET.md").read_text())
