"""The model a node serves, as the API sees it: its names, its identity and its template.

`model_id` is what responses and /v1/models report (`[server] model_id`, else the catalog
alias, else the GGUF's file stem). A request may name the model by that id, by the alias
it was started with, or by the GGUF's file name or stem, case-insensitively; anything else
is `model_not_found`. The fingerprint (content sha256 of the GGUF) and the KV cache type
go into every L1 key, so a replaced file or a different KV precision never reuses answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from node.config import NodeSettings
from node.models.catalog import entry_for_file, looks_like_path
from node.models.fingerprint import model_fingerprint
from node.models.templates import ChatTemplate
from node.serving.engine_client import EngineClient


@dataclass(frozen=True, slots=True)
class ServedModel:
    model_id: str
    names: frozenset[str]
    fingerprint: str
    kv_type: str
    template: ChatTemplate
    n_vocab: int
    n_ctx: int
    bos_token: int | None

    def accepts(self, name: str | None) -> bool:
        """No name means "the model this node serves"; otherwise one of its names."""
        return name is None or name.strip().lower() in self.names

    @property
    def system_fingerprint(self) -> str:
        return f"fp_{self.fingerprint[:12]}"


def describe_model(engine: EngineClient, settings: NodeSettings) -> ServedModel:
    """Blocking (the first fingerprint of a file hashes it): call from a worker thread."""
    config = engine.config
    path = Path(config.model_path)
    requested = settings.model.path
    entry = entry_for_file(path)
    alias = entry.alias if entry else (path.stem if looks_like_path(requested) else requested)
    model_id = settings.server.model_id or alias
    names = {model_id, alias, path.name, path.stem}
    if not looks_like_path(requested):
        names.add(requested)
    info = engine.model_info
    return ServedModel(
        model_id=model_id,
        names=frozenset(name.lower() for name in names),
        fingerprint=model_fingerprint(path),
        kv_type=str(config.kv_type),
        template=ChatTemplate.for_engine(engine),
        n_vocab=info.n_vocab,
        n_ctx=int(engine.n_ctx),
        bos_token=info.bos,
    )
