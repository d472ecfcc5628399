"""The model every benchmark runs by default: the offline gemma3-270m, resolved the way
`reame run` resolves it (assembled once from its PyPI packages into the model store)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def default_model() -> Path:
    sys.path.insert(0, str(ROOT))
    from node.config import home_dir
    from node.models.catalog import resolve_model

    return resolve_model("gemma3-270m", home_dir(os.environ), progress=False).path


def parse_with_model(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """Parse a benchmark's flags plus `--model PATH` (default: the offline model above)."""
    parser.add_argument("--model", type=Path, help="GGUF path (default: the offline gemma3-270m)")
    args = parser.parse_args()
    args.model = args.model or default_model()
    return args
