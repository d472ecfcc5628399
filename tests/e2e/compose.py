"""Running docker-compose.yml from tests: which compose command exists, and the config it renders.

`compose_command()` is `docker compose` (the plugin) when it answers, else `docker-compose`
(Debian's package), else None. `compose()` passes the given environment only and never reads
a `.env` file of the checkout (`--env-file` names an empty file); `rendered(env, *files)` returns the
parsed result of `config`.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
HOST_OVERRIDE = ROOT / "docker-compose.host.yml"


@functools.cache
def compose_command() -> tuple[str, ...] | None:
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return ("docker", "compose")
    if shutil.which("docker-compose"):
        return ("docker-compose",)
    return None


@functools.cache
def empty_env_file() -> str:
    handle, path = tempfile.mkstemp(prefix="reame-compose-", suffix=".env")
    os.close(handle)
    atexit.register(os.unlink, path)
    return path


def compose(env: dict[str, str], *args: str, files: tuple[Path, ...] = (COMPOSE,),
            project: str = "reame", timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    command = compose_command()
    assert command is not None, "no compose command"
    file_args = [arg for path in files for arg in ("-f", str(path))]
    result = subprocess.run([*command, "-p", project, "--project-directory", str(ROOT), "--env-file", empty_env_file(),
                             *file_args, *args],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"compose {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result


def rendered(env: dict[str, str], *files: Path) -> dict[str, Any]:
    """The merged configuration `compose config` prints, parsed."""
    result = compose(env, "config", files=files or (COMPOSE,))
    return yaml.safe_load(result.stdout)
