"""The reame inference node: one llama.cpp model behind an OpenAI-compatible API.

Layout (one line per package; imports point down this list, never up):

    api/        HTTP only: aiohttp app, routes, parsing into serving's requests, response
                shapes, SSE, the one error mapping and its middleware, /metrics, static/
    batches/    no aiohttp: the Batch API's store (SQLite + files), validation, runner; lines
                run through an executor the API provides (its parser, the service)
    serving/    no aiohttp, no llama_cpp: request types, typed errors, the engine-client
                Protocol, prompts, L1 keys, structured output and tool calls, the service
                (a facade over the planner and the jobs: archive -> engine -> archive, one
                way), the ledger of what was served and the savings
                it adds up to; serving/conclave/: best-of-N vote and its runner, OpenAI best_of
                (used by the service and the CLI; never imports sessions, the archive or the cache)
    sessions/   chat sessions (store, turns), template cuts, warm-ahead
    archive/    the archive client (embedded | remote ARCA | Redis/Valkey, standalone or Cluster),
                its URL, breakers, the L4 mirror
    models/     catalog, download, fingerprint, GGUF metadata, chat templates, autoconfig
    cache/      the prefix KV cache (block hashes, RAM, disk, the fleet tier in ARCA)
    speculative/ draft sources (prompt lookup, the Palimpsest, Il Suggeritore), the controller
                that is the engine's Speculator, per-source statistics
    engine/     the runtime: llama.cpp wrapper, scheduler thread, sequences, KV budget,
                sampling, grammar, detokenizer, hooks, the engine's contract types

    cli -> api -> assembly -> batches -> serving -> sessions, archive, cache, speculative, models, engine
        -> shared, arca

assembly.py (at the root) is the one place a node is wired: engine, prefix cache,
speculation controller, archive, fleet tier, L4 mirror, sessions, service and savings, in
one `Node`; the API, the terminal chat and `reame batch MODEL` open it. models/ opens
nothing (autoconfig only); speculative/ knows only the engine's hooks; sessions/ use the cache, the templates, the
engine's contract types and the archive's one error (sessions kept in a remote archive);
engine/ imports nothing else of the node.
At the root: cli.py and commands.py (`reame` and its subcommands), chat.py (the terminal
chat), batch_command.py and batch_output.py (`reame batch`), config.py (the node's settings). tests/test_imports.py checks the directions.
"""

__version__ = "0.1.0"
