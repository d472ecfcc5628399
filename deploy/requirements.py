"""Print the project's requirements from pyproject.toml, one a line: the base install's, or
with an extra's name (`node`) that extra's. The image build installs them in a layer of their
own, before the sources, so a source change does not reinstall every dependency."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path


def requirements(extra: str | None) -> list[str]:
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"] if extra is None else project["optional-dependencies"][extra])


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1] if len(sys.argv) > 1 else None)))
