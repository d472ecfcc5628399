"""The reame inference node: one llama.cpp model behind an OpenAI-compatible API.

Layout (one line per package; imports point down this list, never up):

    api/        HTTP only: aiohttp app, routes, parsing into serving's requests, response
                shapes, SSE, the one error mapping and its middleware, /metrics, static/
    batches/    no aiohttp: the Batch API's store (SQLite + files), validation, runner; lines
                run through an executor the API provides (its parser, the service)
    serving/    no aiohttp, no llama_cpp: request types, typed errors, the engine-client
                Protocol, prompts, L1 keys, the service (archive -> engine -> archive),
                the ledger of what was served and the savings it adds up to
    sessions/   chat sessions (store, turns), template cuts, warm-ahead
    archive/    the archive client (embedded | remote ARCA | Redis/Valkey, standalone or Cluster),
                its URL, breakers, the L4 mirror
    models/     catalog, download, fingerprint, GGUF metadata, chat templates, loader
    cache/      the prefix KV cache (block hashes, RAM, disk, the fleet tier in ARCA)
    engine/     the runtime: llama.cpp wrapper, scheduler thread, sequences, KV budget,
                sampling, grammar, detokenizer, hooks, the engine's contract types

    api -> batches -> serving -> sessions, archive, models, cache, engine -> shared, arca

models/ may open an engine and its cache (the loader); sessions/ use the cache, the
templates, the engine's contract types and the archive's one error (sessions kept in a
remote archive); engine/ imports nothing else of the node.
At the root: cli.py and commands.py (`reame` and its subcommands), chat.py (the terminal
chat), batch_command.py and batch_output.py (`reame batch`), config.py (the node's settings). tests/test_imports.py checks the directions.
"""

__version__ = "0.1.0"
