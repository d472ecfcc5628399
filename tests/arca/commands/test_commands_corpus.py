"""ARCA.OBSERVE/DRAFT/SINCE and ARCA.KVPUT/KVGET/KVEXISTS: through dispatch, then redis-py live."""

from __future__ import annotations

import pytest
import redis

import arca.commands  # noqa: F401  (registers every command family)
from arca.archive import Archive, ArchiveConfig
from arca.commands.registry import CommandContext, dispatch
from arca.protocol import ErrorReply
from arca.state import ClientState, ServerOptions, ServerState
from shared.tokens import pack_tokens, unpack_tokens


@pytest.fixture
def run(tmp_path):
    archive = Archive(ArchiveConfig(directory=tmp_path, corpus_max_bytes=1 << 20, kv_max_bytes=1000))
    ctx = CommandContext(archive, ClientState(id=1), ServerState.from_options(ServerOptions()))
    yield lambda *argv: dispatch(ctx, [a if isinstance(a, bytes) else str(a).encode() for a in argv])
    archive.close()


def test_original_two_argument_forms(run):
    assert run("ARCA.OBSERVE", pack_tokens([10, 11, 12, 13, 14])) == 1
    assert unpack_tokens(run("ARCA.DRAFT", pack_tokens([10, 11, 12]), 4)).tolist() == [13, 14]
    assert run("arca.draft", pack_tokens([77]), 4) is None


def test_namespaced_forms_and_since(run):
    first = run("ARCA.OBSERVE", "NS", "m1", pack_tokens([1, 2, 3]))
    second = run("ARCA.OBSERVE", "ns", "m1", pack_tokens([1, 2, 4]))
    run("ARCA.OBSERVE", pack_tokens([1, 2, 5]))
    assert unpack_tokens(run("ARCA.DRAFT", "NS", "m1", pack_tokens([1, 2]), 2)).tolist() == [4]
    assert unpack_tokens(run("ARCA.DRAFT", pack_tokens([1, 2]), 2)).tolist() == [5]
    assert run("ARCA.SINCE", "NS", "m1", 0) == [[first, pack_tokens([1, 2, 3])], [second, pack_tokens([1, 2, 4])]]
    assert run("ARCA.SINCE", "NS", "m1", first, "COUNT", 1) == [[second, pack_tokens([1, 2, 4])]]
    assert run("ARCA.SINCE", "NS", "m1", second) == []


@pytest.mark.parametrize("argv, message", [
    (("ARCA.OBSERVE", b"\x01\x02\x03"), "ERR token payload length 3 is not a multiple of 4"),
    (("ARCA.OBSERVE", b""), "ERR empty token stream"),
    (("ARCA.OBSERVE", "NS"), "ERR token payload length 2 is not a multiple of 4"),
    (("ARCA.OBSERVE", "a", "b"), "ERR syntax error"),
    (("ARCA.DRAFT", b"\x01\x00\x00", 4), "ERR tail length 3 is not a multiple of 4"),
    (("ARCA.DRAFT", pack_tokens([1]), "x"), "ERR k must be a positive integer"),
    (("ARCA.DRAFT", pack_tokens([1]), 0), "ERR k must be a positive integer"),
    (("ARCA.DRAFT", pack_tokens([1]), -3), "ERR k must be a positive integer"),
    (("ARCA.DRAFT", pack_tokens([1]), 257), "ERR k must be at most 256"),
    (("ARCA.DRAFT", pack_tokens([1])), "ERR wrong number of arguments for 'arca.draft' command"),
    (("ARCA.SINCE", "x"), "ERR invalid cursor"),
    (("ARCA.SINCE", -1), "ERR invalid cursor"),
    (("ARCA.SINCE", 0, "LIMIT", 3), "ERR syntax error"),
    (("ARCA.SINCE", 0, "COUNT", 0), "ERR COUNT must be within 1..10000"),
    (("ARCA.KVPUT", "k"), "ERR wrong number of arguments for 'arca.kvput' command"),
])
def test_bad_input_gets_clear_errors(run, argv, message):
    reply = run(*argv)
    assert isinstance(reply, ErrorReply) and str(reply).startswith(message)


def test_kv_blocks(run):
    assert run("ARCA.KVPUT", "h1", b"blob-1") == 1
    assert run("ARCA.KVPUT", "h1", b"other") == 0          # never rewritten
    assert run("ARCA.KVGET", "h1") == b"blob-1"
    assert run("ARCA.KVGET", "h2") is None
    assert run("ARCA.KVEXISTS", "h1", "h2", "h1") == [1, 0, 1]
    reply = run("ARCA.KVPUT", "big", b"x" * 1001)
    assert isinstance(reply, ErrorReply) and str(reply).startswith("OOM")


def test_live_server_with_redis_py(arca):
    for protocol in (2, 3):
        client = redis.Redis(host=arca.host, port=arca.port, protocol=protocol)
        ns = f"model-{protocol}"
        stream_id = client.execute_command("ARCA.OBSERVE", "NS", ns, pack_tokens([10, 11, 12, 13, 14]))
        assert isinstance(stream_id, int)
        reply = client.execute_command("ARCA.DRAFT", "NS", ns, pack_tokens([10, 11, 12]), 4)
        assert unpack_tokens(reply).tolist() == [13, 14]
        assert client.execute_command("ARCA.SINCE", "NS", ns, stream_id - 1) == [[stream_id, pack_tokens([10, 11, 12, 13, 14])]]
        with pytest.raises(redis.ResponseError, match="multiple of 4"):
            client.execute_command("ARCA.OBSERVE", b"abc")
        assert client.execute_command("ARCA.KVPUT", f"block-{protocol}", b"\x00state") == 1
        assert client.execute_command("ARCA.KVGET", f"block-{protocol}") == b"\x00state"
        assert client.execute_command("ARCA.KVEXISTS", f"block-{protocol}", "nope") == [1, 0]
        assert client.ping()
        client.close()
    assert arca.call(lambda: arca.archive.pending_writes) == 0     # acknowledged means committed
