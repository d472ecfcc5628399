"""MULTI/EXEC/DISCARD through dispatch: queueing, errors at queue time, errors at run time."""

from __future__ import annotations

from arca.protocol import ErrorReply, Status
from arca_harness import run


def test_exec_runs_the_queue_in_order(ctx):
    assert run(ctx, "MULTI") == Status("OK")
    assert run(ctx, "SET", "a", "1") == Status("QUEUED")
    assert run(ctx, "INCR", "a") == Status("QUEUED")
    assert run(ctx, "GET", "a") == Status("QUEUED")
    assert run(ctx, "EXISTS", "a") == Status("QUEUED")
    assert run(ctx, "GET", "a") == Status("QUEUED")
    assert run(ctx, "EXEC") == [Status("OK"), 2, b"2", 1, b"2"]
    assert ctx.client.multi is None


def test_runtime_errors_stay_inside_the_result(ctx):
    run(ctx, "SET", "s", "text")
    run(ctx, "MULTI")
    run(ctx, "INCR", "s")
    run(ctx, "SET", "b", "1")
    assert run(ctx, "EXEC") == [ErrorReply("ERR value is not an integer or out of range"), Status("OK")]


def test_queue_time_errors_abort_the_transaction(ctx):
    run(ctx, "MULTI")
    assert run(ctx, "NOPE").startswith("ERR unknown command")
    assert run(ctx, "SET", "b", "1") == Status("QUEUED")
    assert run(ctx, "EXEC") == ErrorReply("EXECABORT Transaction discarded because of previous errors.")
    assert run(ctx, "GET", "b") is None


def test_misuse(ctx):
    assert run(ctx, "EXEC") == ErrorReply("ERR EXEC without MULTI")
    assert run(ctx, "DISCARD") == ErrorReply("ERR DISCARD without MULTI")
    run(ctx, "MULTI")
    assert run(ctx, "MULTI") == ErrorReply("ERR MULTI calls can not be nested")
    run(ctx, "SET", "x", "1")
    assert run(ctx, "DISCARD") == Status("OK")
    assert run(ctx, "GET", "x") is None
    run(ctx, "MULTI")
    assert run(ctx, "RESET") == Status("RESET")
    assert ctx.client.multi is None
