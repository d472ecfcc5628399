"""`reame arca`: parse flags and config, open the archive, serve until SIGTERM/SIGINT.

Exit codes: 0 after a clean shutdown, 2 for a configuration problem (including protected
mode refusing a public address without a password), 3 for a damaged database, 1 when the
address cannot be bound.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import sys
from pathlib import Path

from arca import __version__
from arca.config import DURABILITY, ArcaConfig, load_config
from arca.state import ServerOptions
from shared.config import ConfigError
from shared.logs import LEVELS, configure_logging

log = logging.getLogger("arca")

MIB = 1024 * 1024
EXIT_BIND, EXIT_CONFIG, EXIT_CORRUPT = 1, 2, 3


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reame arca",
        description="ARCA: the reame archive daemon (Redis protocol, SQLite storage).",
    )
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="TCP port (default 6420; 0 = any free port; -1 = none)")
    parser.add_argument("--tls-port", type=int, help="TLS port (default 0 = no TLS listener)")
    parser.add_argument("--tls-cert-file", help="the server's certificate chain (PEM)")
    parser.add_argument("--tls-key-file", help="the server's private key (PEM)")
    parser.add_argument("--tls-ca-cert-file", help="CA that client certificates must chain to (PEM)")
    parser.add_argument("--tls-auth-clients", choices=("yes", "no", "optional"),
                        help="client certificates required (yes, default), verified if sent (optional), or not asked")
    parser.add_argument("--dir", help="archive directory (default ~/.reame/arca)")
    parser.add_argument("--max-mb", type=int, help="L1 budget in MB (default 256)")
    parser.add_argument("--requirepass", help="password clients must AUTH with (or env REAME_ARCA_PASSWORD)")
    parser.add_argument("--durability", choices=DURABILITY, help="commit (default), fsync or everysec")
    parser.add_argument("--protected-mode", choices=("yes", "no"), help="refuse public binds without a password")
    parser.add_argument("--config", type=Path, help="INI file (see conf/arca.conf)")
    parser.add_argument("--log-level", choices=LEVELS, help="log verbosity (default info)")
    parser.add_argument("--version", action="version", version=f"reame arca {__version__}")
    return parser


def config_from_argv(argv: list[str]) -> ArcaConfig:
    args = _parser().parse_args(argv)
    flags = {
        "server.host": args.host,
        "server.port": args.port,
        "server.tls-port": args.tls_port,
        "server.tls-cert-file": args.tls_cert_file,
        "server.tls-key-file": args.tls_key_file,
        "server.tls-ca-cert-file": args.tls_ca_cert_file,
        "server.tls-auth-clients": args.tls_auth_clients,
        "storage.dir": args.dir,
        "storage.max-mb": args.max_mb,
        "server.requirepass": args.requirepass,
        "storage.durability": args.durability,
        "server.protected-mode": None if args.protected_mode is None else args.protected_mode == "yes",
        "server.log-level": args.log_level,
    }
    return load_config(flags, file=args.config)


def protected_mode_refusal(config: ArcaConfig) -> str | None:
    """Why the daemon must not start on this address, or None."""
    if config.protected_mode and not config.binds_loopback_only and config.requirepass is None:
        listener = " (TLS included: a client certificate is not a password)" if config.tls_port else ""
        return (
            f"refusing to listen on {config.host} without a password (protected mode){listener}: anyone who "
            "can reach this address could read and overwrite the archive. Set requirepass "
            "(--requirepass or REAME_ARCA_PASSWORD), bind 127.0.0.1, or switch protected mode off "
            "with --protected-mode no if a firewall already guards the port."
        )
    return None


def open_archive(config: ArcaConfig):
    from arca.archive import Archive, ArchiveConfig

    return Archive(
        ArchiveConfig(
            directory=config.directory,
            max_bytes=config.max_mb * MIB,
            corpus_max_bytes=config.corpus_max_mb * MIB,
            kv_max_bytes=config.kv_max_mb * MIB,
            durability=config.durability,
            ngram_min=config.ngram_min,
            ngram_max=config.ngram_max,
            draft_max_k=config.draft_max_k,
        )
    )


def server_options(config: ArcaConfig) -> ServerOptions:
    """The server's options; ConfigError when the TLS files cannot be used."""
    context = None
    if config.tls_port:
        from arca.tls import server_context

        context = server_context(config.tls_cert_file, config.tls_key_file, config.tls_ca_cert_file,
                                 config.tls_auth_clients)
    return ServerOptions(
        host=config.host,
        port=config.port,
        tls_port=config.tls_port,
        tls_context=context,
        tls_require_client_cert=config.tls_auth_clients == "yes",
        durability=config.durability,
        limits=config.limits,
        maxclients=config.maxclients,
        slowlog_log_slower_than=config.slowlog_log_slower_than,
        slowlog_max_len=config.slowlog_max_len,
        requirepass=config.requirepass,
        protected_mode=config.protected_mode,
        directory=str(config.directory),
        max_bytes=config.max_mb * MIB,
        config_file=str(config.config_file or ""),
    )


async def serve(archive, config: ArcaConfig, options: ServerOptions) -> None:
    """Serve until SIGTERM or SIGINT, then shut down gracefully."""
    from arca.server import ArcaServer

    server = ArcaServer(archive, options)
    host, port = await server.start()
    plain = f"{host}:{server.state.tcp_port}" if options.port >= 0 else "no plain TCP"
    tls = (f", TLS on {host}:{server.state.tls_port} (client certificates: {config.tls_auth_clients})"
           if options.tls_port else "")
    log.info(
        "ARCA %s listening on %s%s (dir %s, L1 budget %d MB, durability %s%s)",
        __version__, plain, tls, config.directory, config.max_mb, config.durability,
        ", password required" if config.requirepass else "",
    )
    stop = server.shutdown_requested  # SHUTDOWN, SIGTERM and SIGINT all end up here
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    log.info("shutting down: no new connections, answering what is in flight")
    await server.close()


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def main(argv: list[str]) -> int:
    try:
        config = config_from_argv(argv)
    except ConfigError as exc:
        print(f"reame arca: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    configure_logging(config.log_level)
    refusal = protected_mode_refusal(config)
    if refusal:
        log.error("%s", refusal)
        return EXIT_CONFIG
    try:
        options = server_options(config)
    except ConfigError as exc:
        log.error("%s", exc)
        return EXIT_CONFIG
    from arca.archive import ArchiveCorruptError, ArchiveError

    try:
        archive = open_archive(config)
    except ArchiveCorruptError as exc:
        log.error("damaged database %s: %s", exc.path, exc.detail)
        log.error("recovery: %s", exc.hint)
        return EXIT_CORRUPT
    except (ArchiveError, ValueError) as exc:
        log.error("cannot open the archive in %s: %s", config.directory, exc)
        return EXIT_CONFIG
    # What the archive loaded is long-lived: keep the cyclic collector from rescanning it,
    # and let it run less often on the many short-lived lists requests create.
    gc.freeze()
    gc.set_threshold(10_000, 20, 20)
    loop = _new_loop()
    try:
        loop.run_until_complete(serve(archive, config, options))
    except OSError as exc:
        ports = " / ".join(str(p) for p in (config.port, config.tls_port) if p > 0) or "a free port"
        log.error("cannot listen on %s port %s: %s", config.host, ports, exc.strerror or exc)
        return EXIT_BIND
    finally:
        try:
            archive.close()
        except ArchiveError as exc:  # a full disk at shutdown: what it held was never acknowledged
            log.error("the last commit failed (%s); the writes it held were never acknowledged", exc)
        loop.close()
    log.info("ARCA stopped; every acknowledged write is committed")
    return 0
