"""The reame inference node: one llama.cpp model behind an OpenAI-compatible API.

Layout (one line per package or root module; imports point down this list, never up):

    cli/        `reame` and its subcommands (main.py, commands.py), the terminal chat and
                one-shot answers (chat.py), `reame batch` and its output file (batch.py,
                batch_output.py); `python -m node.cli` is `reame`
    api/        HTTP only: aiohttp app, routes, parsing into serving's requests, response
                shapes, SSE, the one error mapping and its middleware, /metrics, static/
    assembly.py the one place a node is wired: engine, prefix cache, speculation controller,
                archive, fleet tier, L4 mirror, sessions, service and savings in one `Node`,
                which the API, the terminal chat and `reame batch MODEL` open
    batches/    no aiohttp: the Batch API's store (SQLite + files), validation, runner; lines
                run through an executor the API provides (its parser, the service)
    serving/    no aiohttp, no llama_cpp: request types, typed errors, the engine-client
                Protocol, prompts, L1 keys, structured output, tool calls (tools.py), and the
                service, one way down: a facade over the planner (request -> plan) and the jobs
                (lookup, prefetch, submits, finish -> ledger and L1/L4), which answers and the
                Conclave's events take; the ledger of what was served and the savings it adds
                up to; serving/conclave/: best-of-N vote and its runner, OpenAI best_of
    sessions/   chat sessions (store, turns), template cuts, warm-ahead
    archive/    the archive client (embedded | remote ARCA | Redis/Valkey, standalone or Cluster),
                breakers, the L4 mirror
    cache/      the prefix KV cache (block hashes, RAM, disk, the fleet tier in ARCA)
    models/     catalog, download, fingerprint, GGUF metadata, chat templates, autoconfig
                (it opens nothing: assembly.py does), their errors
    speculative/ draft sources (prompt lookup, the Palimpsest, Il Suggeritore), the controller
                that is the engine's Speculator, per-source statistics; knows only the engine
    engine/     the runtime: llama.cpp wrapper, scheduler thread, sequences, KV budget,
                sampling, grammar, detokenizer, hooks, the engine's contract types; imports
                nothing else of the node
    config.py   the node's settings (one table of keys, INI -> frozen dataclasses)
    address.py  the archive's address form (`[arca] remote`), read by the settings and the client

    cli -> api -> assembly -> batches -> serving -> sessions -> archive, cache -> models
        -> speculative -> engine -> config -> address -> shared, arca

sessions/ use the cache, the templates, the engine's contract types and the archive's one
error (sessions kept in a remote archive). tests/test_imports.py checks the directions.
"""

__version__ = "0.1.0"
