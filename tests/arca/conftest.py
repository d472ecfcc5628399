"""ARCA fixtures: servers on 127.0.0.1 (see arca_harness.py) and a CommandContext for dispatch."""

from __future__ import annotations

import pytest

from arca.archive import Archive, ArchiveConfig
from arca.state import ServerOptions
from arca_harness import ServerThread, start_server


@pytest.fixture
def arca(tmp_path):
    server = start_server(tmp_path)
    yield server
    server.stop()


@pytest.fixture
def arca_factory(tmp_path):
    """Start servers with custom options; all are stopped at the end of the test."""
    servers = []

    def make(**options) -> ServerThread:
        index = len(servers)
        server = start_server(tmp_path / f"s{index}", **options)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def ctx(tmp_path):
    """A CommandContext over a real archive, for calling dispatch directly."""
    from arca.commands.registry import CommandContext
    from arca.state import ClientState, ServerState

    archive = Archive(ArchiveConfig(directory=tmp_path / "ctx-arca", max_bytes=8 << 20))
    state = ServerState.from_options(ServerOptions(port=0, max_bytes=8 << 20, directory=str(tmp_path)))
    client = ClientState(id=state.new_client_id())
    state.clients[client.id] = client
    yield CommandContext(archive, client, state)
    archive.close()

