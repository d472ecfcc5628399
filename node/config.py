"""The node's settings: one option table, resolved once at start-up into frozen dataclasses.

Keys follow the INI sections of conf/reame.conf (the original C++ reame's keys plus ours).
Precedence is command-line flag > environment (REAME_<SECTION>_<KEY>) > file > default; an
error names the file, section and key (or the flag / environment variable) it came from.
`python -m node.config` prints the commented default file (conf/reame.conf is that output).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from shared.config import ConfigError, Option, home_dir, render_ini, resolve

KV_TYPES = ("auto", "f16", "q8_0", "q4_0")


def _opt(section: str, key: str, type_: type, default: Any, doc: str,
         choices: tuple[str, ...] | None = None) -> Option:
    return Option(section, key, type_, default, doc,
                  env=f"REAME_{section}_{key}".upper(), choices=choices)


OPTIONS: tuple[Option, ...] = (
    _opt("model", "path", str, "gemma3-270m",
         "Model: a catalog alias (`reame list`) or a path to a GGUF file."),
    _opt("model", "context_length", int, 0,
         "Context size in tokens shared by all slots; 0 = model default x parallel, capped by RAM."),
    _opt("model", "threads", int, 0,
         "CPU threads; 0 = all cores (cores - 1 above 4); -1 = that, tuned online (fewer when measured faster)."),
    _opt("model", "batch", int, 512, "Logical batch size: most tokens one decode step takes."),
    _opt("model", "ubatch", int, 512, "Physical micro-batch size inside one decode step."),
    _opt("model", "extra_buffers", str, "auto",
         "llama.cpp's extra buffer types (AMX, CPU weight repacking): auto = a probe at start decides "
         "(off where they crash, else the faster way; cached in <home>/kernels), on, off.",
         ("auto", "on", "off")),
    _opt("memory", "use_mmap", bool, True,
         "Map the model file instead of reading it into RAM (not with huge_pages, which reads it)."),
    _opt("memory", "use_mlock", bool, False, "Lock the model in RAM (never swapped out)."),
    _opt("memory", "huge_pages", str, "auto",
         "Read the model's weights into huge pages (Linux transparent huge pages, 2 MiB on x86-64): steps of 2-12 rows "
         "~10% faster by measurement, 0.6 s more at start for 235 MiB. auto = where the kernel offers "
         "them (always or madvise) and the model is at most half the RAM available; on (an error where "
         "the kernel offers none); off.",
         ("auto", "on", "off")),
    _opt("memory", "kv_cache_type", str, "auto",
         "KV cache element type: f16, q8_0 or q4_0; auto = f16 when it fits in RAM, else smaller.",
         KV_TYPES),
    _opt("cache", "enabled", bool, True, "Prefix KV cache: reuse the KV of prompts seen before."),
    _opt("cache", "directory", str, "", "Prefix cache directory; empty = <home>/cache."),
    _opt("cache", "ram_mb", int, 256, "RAM tier of the prefix cache, in MB."),
    _opt("cache", "max_size_mb", int, 512, "Disk budget of the prefix cache, in MB (LRU eviction)."),
    _opt("cache", "compress", bool, False,
         "Compress cached KV blocks with zstd (KV states shrink only ~1.1x; off by measurement)."),
    _opt("cache", "block_tokens", int, 32,
         "Tokens per cached block: a restorable boundary every block (32 by measurement)."),
    _opt("cache", "resident", bool, True,
         "A slot keeps its KV when its request ends: a prompt sharing its prefix continues from the exact "
         "token it differs at, before any cache tier is asked (evicted when the cells are needed)."),
    _opt("server", "host", str, "127.0.0.1", "Address to listen on (0.0.0.0 exposes the node)."),
    _opt("server", "port", int, 8080, "TCP port of the OpenAI-compatible API."),
    _opt("server", "max_concurrent_requests", int, 64,
         "HTTP requests in flight at once; more are answered 503."),
    _opt("server", "max_queue", int, 64, "Requests waiting for a slot; beyond it: overloaded (503)."),
    _opt("server", "max_queue_wait_s", float, 30.0,
         "Longest a live request waits for a slot and KV room, in seconds; then 503 + Retry-After (0 = no bound)."),
    _opt("server", "shutdown_flush_s", float, 10.0,
         "On SIGTERM or Ctrl-C, longest wait for pending archive writes (L1 answers, L4 corpus, L3 states) to "
         "reach the archive, in seconds; what is left is logged and dropped."),
    _opt("server", "max_sessions", int, 1000,
         "Chat sessions kept; past it the least recently used is dropped (the expired first)."),
    _opt("server", "max_sessions_per_client", int, 100,
         "Chat sessions one client (API key and address) may hold; past it POST /v1/sessions is 429 (0 = no bound)."),
    _opt("server", "max_request_size_mb", int, 8, "Largest request body accepted, in MB (413 above)."),
    _opt("server", "enable_cors", bool, False, "Send CORS headers (browsers on other origins)."),
    _opt("server", "enable_metrics", bool, True, "Serve Prometheus metrics on /metrics."),
    _opt("server", "api_key", str, "",
         "Bearer key required on every route (/health shows only its status without it); empty = none."),
    _opt("server", "api_keys", str, "",
         "More bearer keys, comma-separated, each accepted like api_key; each key is a tenant of its own: "
         "cached answers and prefix states are not shared between keys (docs/API.md)."),
    _opt("server", "model_id", str, "", "Model name reported by /v1/models; empty = the alias."),
    _opt("server", "parallel", int, 0, "Sequences decoded together in one batch; 0 = auto (4)."),
    _opt("speculative", "enabled", bool, True,
         "Speculative decoding: verify drafted tokens in the batch (output is unchanged)."),
    _opt("speculative", "sources", str, "lookup,archive,format",
         "Draft sources, comma-separated: lookup (the request's own text, and what its sibling candidates drew), archive (past generations), "
         "format (Il Suggeritore: forced grammar tokens and form rules), model (a draft model: draft_model_path)."),
    _opt("speculative", "draft_model_path", str, "",
         "GGUF of a draft model with the target's vocabulary (source model); empty = none."),
    _opt("speculative", "min_draft", int, 1, "Shortest draft worth verifying, in tokens."),
    _opt("speculative", "max_draft", int, 16, "Longest draft verified per sequence and step, in tokens."),
    _opt("speculative", "archive_tokens", int, 1_000_000,
         "Past-generation tokens the archive source keeps in RAM (about 100 bytes each)."),
    _opt("speculative", "measure_first", bool, True,
         "Measure what a decode step costs by its size before serving, where no earlier start kept it "
         "(about 6 s on 2 cores); false serves at once and measures when idle."),
    _opt("batch", "enabled", bool, True,
         "Serve the Batch API (/v1/files, /v1/batches) and run its batches in the background."),
    _opt("batch", "directory", str, "", "Batch API files and progress (SQLite); empty = <home>/batches."),
    _opt("batch", "max_file_mb", int, 100, "Largest file POST /v1/files accepts, in MB (413 above)."),
    _opt("batch", "max_storage_mb", int, 2048,
         "Bytes all stored files and running batches' results may take, in MB; an upload past it is refused "
         "(507), a batch whose results reach it fails (storage_full); nothing is evicted."),
    _opt("batch", "max_files_per_client", int, 1000,
         "Uploaded files one client (API key and address) may keep; past it POST /v1/files is 429 (0 = no bound)."),
    _opt("batch", "max_lines", int, 50_000, "Most request lines one batch input file may hold."),
    _opt("batch", "concurrency", int, 0,
         "Batch lines in flight at once; 0 = the engine's slots minus interactive_slots."),
    _opt("batch", "interactive_slots", int, 1,
         "Engine slots batch lines leave free for live requests (0 = a batch may fill every slot)."),
    _opt("embeddings", "batch_tokens", int, 256,
         "Tokens of one embedding batch (one llama_decode), and so the most tokens of one input "
         "(400 above); its buffers hold about 2 MiB per token for a 262k vocabulary, made at the first embedding."),
    _opt("embeddings", "max_inputs", int, 2048, "Most inputs one POST /v1/embeddings may hold (400 above)."),
    _opt("embeddings", "max_request_tokens", int, 300_000,
         "Most tokens all inputs of one embedding request may hold together (400 above)."),
    _opt("stats", "window_minutes", int, 15, "The recent window GET /v1/reame/stats reports beside since-start."),
    _opt("stats", "sample_seconds", int, 10, "Seconds between two points of the savings trend."),
    _opt("stats", "log_minutes", int, 5,
         "Minutes between two savings log lines while the node is busy; 0 = never logged."),
    _opt("conclave", "max_candidates", int, 16,
         "Largest N a request may ask for with \"conclave\": N or --conclave N (1-16)."),
    _opt("conclave", "explore_temperature", float, 0.7,
         "Candidates after the first sample at least this hot (the first is the request unchanged)."),
    _opt("conclave", "seed", int, 0,
         "Base seed of the explorers (candidate i: seed + i) when the request gives none."),
    _opt("conclave", "adaptive", bool, True,
         "Start an absolute majority of the N candidates, the rest only when they disagree; all N at once "
         "while half or more of the node's last 8 Conclaves of N needed their rest."),
    _opt("arca", "remote", str, "",
         "Shared archive: host:port, arca:// or redis://[user:password@]host:port, rediss:// (TLS), "
         "redis+cluster://host:port,host:port,... or rediss+cluster://...; empty = embedded in this node."),
    _opt("arca", "password", str, "", "AUTH password of the remote archive (a URL's own password wins); empty = none."),
    _opt("arca", "kv_remote", str, "",
         "L3 (shared KV states) on a server of its own, same forms as remote; empty = the remote archive."),
    _opt("arca", "tls_ca_cert_file", str, "",
         "rediss://: CA certificate that signed the server's; empty = the system's trust store."),
    _opt("arca", "tls_cert_file", str, "", "rediss://: this node's certificate, for servers that verify clients."),
    _opt("arca", "tls_key_file", str, "", "rediss://: the private key of tls_cert_file."),
    _opt("arca", "l1_ttl_s", int, 604800, "Seconds an exact answer (L1) lives in the archive; 0 = until evicted."),
    _opt("arca", "kv_ttl_s", int, 86400,
         "Plain Redis/Valkey: seconds a shared KV state (L3) lives after its last use; 0 = until evicted."),
    _opt("arca", "corpus_max_streams", int, 100000,
         "Plain Redis/Valkey: generations kept in each model's L4 stream (XADD MAXLEN ~)."),
    _opt("arca", "timeout_ms", int, 200, "Remote ARCA timeout; a slower answer counts as a miss."),
    _opt("arca", "directory", str, "", "Embedded archive directory; empty = <home>/arca."),
    _opt("arca", "max_mb", int, 1024, "Embedded archive byte budget, in MB."),
    _opt("arca", "observe", bool, True, "Feed finished generations to the corpus (L4) for drafts."),
    _opt("arca", "observe_prompt_tokens", int, 64,
         "Prompt tokens before each generation included in its observation."),
)

OPTIONS_BY_NAME: Mapping[str, Option] = {option.name: option for option in OPTIONS}

HEADER = """\
reame node configuration: every key is present with its default value; edit what you need.
Precedence: command-line flag > environment (REAME_<SECTION>_<KEY>) > this file > default.
Use it with:  reame --config reame.conf --serve   or   reame run MODEL --config reame.conf"""


@dataclass(frozen=True, slots=True)
class ModelSettings:
    path: str
    context_length: int
    threads: int
    batch: int
    ubatch: int
    extra_buffers: str


@dataclass(frozen=True, slots=True)
class MemorySettings:
    kv_cache_type: str
    use_mmap: bool
    use_mlock: bool
    huge_pages: str


@dataclass(frozen=True, slots=True)
class ServerSettings:
    host: str
    port: int
    api_key: str | None
    api_keys: tuple[str, ...]
    parallel: int
    max_queue: int
    max_queue_wait_s: float
    shutdown_flush_s: float
    max_sessions: int
    max_sessions_per_client: int
    max_concurrent_requests: int
    max_request_size_mb: int
    enable_cors: bool
    enable_metrics: bool
    model_id: str | None

    @property
    def keys(self) -> tuple[str, ...]:
        """Every key a request may present: api_key, then api_keys (none: the node is open)."""
        return tuple(dict.fromkeys(key for key in ((self.api_key or ""), *self.api_keys) if key))


@dataclass(frozen=True, slots=True)
class ArcaSettings:
    remote: str | None
    password: str | None
    kv_remote: str | None
    tls_ca_cert_file: str | None
    tls_cert_file: str | None
    tls_key_file: str | None
    l1_ttl_s: int
    kv_ttl_s: int
    corpus_max_streams: int
    timeout_ms: int
    directory: Path
    max_mb: int
    observe: bool
    observe_prompt_tokens: int

    @property
    def remote_address(self) -> tuple[str, int] | None:
        """The (first) host and port of `remote`."""
        if not self.remote:
            return None
        from node.address import parse_address

        return parse_address(self.remote).hosts[0]


@dataclass(frozen=True, slots=True)
class SpeculativeSettings:
    enabled: bool
    sources: tuple[str, ...]
    draft_model_path: str | None
    min_draft: int
    max_draft: int
    archive_tokens: int
    measure_first: bool


@dataclass(frozen=True, slots=True)
class ConclaveSettings:
    max_candidates: int
    explore_temperature: float
    seed: int
    adaptive: bool


@dataclass(frozen=True, slots=True)
class CacheSettings:
    enabled: bool
    directory: Path
    ram_mb: int
    max_size_mb: int
    compress: bool
    block_tokens: int
    resident: bool


@dataclass(frozen=True, slots=True)
class BatchSettings:
    enabled: bool
    directory: Path
    max_file_mb: int
    max_storage_mb: int
    max_files_per_client: int
    max_lines: int
    concurrency: int
    interactive_slots: int


@dataclass(frozen=True, slots=True)
class EmbeddingSettings:
    batch_tokens: int
    max_inputs: int
    max_request_tokens: int


@dataclass(frozen=True, slots=True)
class StatsSettings:
    window_minutes: int
    sample_seconds: int
    log_minutes: int


@dataclass(frozen=True, slots=True)
class NodeSettings:
    model: ModelSettings
    memory: MemorySettings
    server: ServerSettings
    arca: ArcaSettings
    cache: CacheSettings
    speculative: SpeculativeSettings
    batch: BatchSettings
    stats: StatsSettings
    conclave: ConclaveSettings
    embeddings: EmbeddingSettings
    home: Path
    config_file: Path | None = None


SPECULATION_SOURCES = ("lookup", "archive", "format", "model")


def _sources(value: str) -> str | None:
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in SPECULATION_SOURCES]
    if unknown:
        return f"unknown source {unknown[0]!r}: expected a comma-separated list of {', '.join(SPECULATION_SOURCES)}"
    return None


def _at_least(low: int) -> Callable[[Any], str | None]:
    return lambda value: None if value >= low else f"must be >= {low}, got {value}"


def _port(value: int) -> str | None:
    return None if 0 <= value <= 65535 else f"must be a TCP port 0-65535, got {value}"


def _remote(value: str) -> str | None:
    if not value:
        return None
    from node.address import parse_address

    try:
        parse_address(value)
    except ValueError as exc:
        return str(exc)
    return None


CHECKS: Mapping[str, Callable[[Any], str | None]] = {
    "model.path": lambda v: None if v else "must name a model",
    "model.context_length": _at_least(0),
    "model.threads": _at_least(-1),
    "model.batch": _at_least(1),
    "model.ubatch": _at_least(1),
    "cache.ram_mb": _at_least(0),
    "cache.max_size_mb": _at_least(0),
    "cache.block_tokens": _at_least(1),
    "server.port": _port,
    "server.max_concurrent_requests": _at_least(1),
    "server.max_queue": _at_least(1),
    "server.max_queue_wait_s": _at_least(0),
    "server.shutdown_flush_s": _at_least(0),
    "server.max_sessions": _at_least(1),
    "server.max_sessions_per_client": _at_least(0),
    "server.max_request_size_mb": _at_least(1),
    "server.parallel": _at_least(0),
    "speculative.sources": _sources,
    "speculative.min_draft": _at_least(1),
    "speculative.max_draft": _at_least(1),
    "speculative.archive_tokens": _at_least(0),
    "arca.remote": _remote,
    "arca.kv_remote": _remote,
    "arca.l1_ttl_s": _at_least(0),
    "arca.kv_ttl_s": _at_least(0),
    "arca.corpus_max_streams": _at_least(1),
    "batch.max_file_mb": _at_least(1),
    "batch.max_storage_mb": _at_least(1),
    "batch.max_files_per_client": _at_least(0),
    "batch.max_lines": _at_least(1),
    "batch.concurrency": _at_least(0),
    "batch.interactive_slots": _at_least(0),
    "embeddings.batch_tokens": _at_least(1),
    "embeddings.max_inputs": _at_least(1),
    "embeddings.max_request_tokens": _at_least(1),
    "stats.window_minutes": _at_least(1),
    "stats.sample_seconds": _at_least(1),
    "stats.log_minutes": _at_least(0),
    "conclave.max_candidates": lambda v: None if 1 <= v <= 16 else f"must be between 1 and 16, got {v}",
    "conclave.explore_temperature": lambda v: None if 0.0 <= v <= 2.0 else f"must be between 0 and 2, got {v}",
    "conclave.seed": lambda v: None if 0 <= v < 2**63 else f"must be between 0 and 2**63 - 1, got {v}",
    "arca.timeout_ms": _at_least(1),
    "arca.max_mb": _at_least(1),
    "arca.observe_prompt_tokens": _at_least(0),
}


def _origin(option: Option, file: Path | None, env: Mapping[str, str],
            flags: Mapping[str, Any]) -> str:
    if flags.get(option.name) is not None:
        return f"command line ({option.name})"
    if option.env and option.env in env:
        return f"environment {option.env} ({option.name})"
    return f"{file}: [{option.section}] {option.key}" if file else f"default {option.name}"


def _check(values: Mapping[str, Any], file: Path | None, env: Mapping[str, str],
           flags: Mapping[str, Any]) -> None:
    for option in OPTIONS:
        check = CHECKS.get(option.name)
        problem = check(values[option.name]) if check else None
        if problem:
            raise ConfigError(f"{_origin(option, file, env, flags)}: {problem}")


def load_settings(config_file: Path | None, flags: Mapping[str, Any] | None = None, *,
                  env: Mapping[str, str] | None = None) -> NodeSettings:
    """Resolve every option (flag > env > file > default) into NodeSettings.

    `flags` maps 'section.key' to typed values; None means the flag was not given.
    """
    env = os.environ if env is None else env
    flags = dict(flags or {})
    file = Path(config_file).expanduser() if config_file else None
    values = resolve(OPTIONS, file=file, env=env, flags=flags)
    _check(values, file, env, flags)
    if values["speculative.min_draft"] > values["speculative.max_draft"]:
        raise ConfigError(f"{_origin(OPTIONS_BY_NAME['speculative.min_draft'], file, env, flags)}: "
                          f"must be <= speculative.max_draft ({values['speculative.max_draft']})")
    drafting_model = "model" in [name.strip() for name in str(values["speculative.sources"]).split(",")]
    if drafting_model != bool(values["speculative.draft_model_path"]):
        which = "speculative.sources" if not drafting_model else "speculative.draft_model_path"
        raise ConfigError(f"{_origin(OPTIONS_BY_NAME[which], file, env, flags)}: the draft-model source needs both "
                          f"'model' in speculative.sources and a speculative.draft_model_path")
    home = home_dir(env)

    def section(name: str) -> dict[str, Any]:
        return {key.split(".", 1)[1]: value for key, value in values.items()
                if key.startswith(name + ".")}

    def directory(text: str, default: str) -> Path:
        return Path(text).expanduser() if text else home / default

    def optional(text: str) -> str | None:
        return text or None

    server = section("server")
    arca = section("arca")
    cache = section("cache")
    spec = section("speculative")
    return NodeSettings(
        model=ModelSettings(**section("model")),
        memory=MemorySettings(**section("memory")),
        server=ServerSettings(**{**server, "api_key": optional(server["api_key"]),
                                 "api_keys": tuple(key.strip() for key in server["api_keys"].split(",")
                                                   if key.strip()),
                                 "model_id": optional(server["model_id"])}),
        arca=ArcaSettings(**{**arca, "remote": optional(arca["remote"]), "kv_remote": optional(arca["kv_remote"]),
                             "password": optional(arca["password"]),
                             **{name: optional(arca[name]) for name in ("tls_ca_cert_file", "tls_cert_file",
                                                                        "tls_key_file")},
                             "directory": directory(arca["directory"], "arca")}),
        cache=CacheSettings(**{**cache, "directory": directory(cache["directory"], "cache")}),
        speculative=SpeculativeSettings(**{
            **spec, "sources": tuple(dict.fromkeys(n.strip() for n in spec["sources"].split(",") if n.strip())),
            "draft_model_path": optional(spec["draft_model_path"])}),
        batch=BatchSettings(**{**section("batch"), "directory": directory(section("batch")["directory"], "batches")}),
        stats=StatsSettings(**section("stats")),
        conclave=ConclaveSettings(**section("conclave")),
        embeddings=EmbeddingSettings(**section("embeddings")),
        home=home,
        config_file=file,
    )


def default_config_text() -> str:
    return render_ini(OPTIONS, HEADER)


if __name__ == "__main__":
    print(default_config_text(), end="")
