"""SLOWLOG and its settings, CONFIG RESETSTAT and INFO cpu: through dispatch and a real server."""

from __future__ import annotations

import redis

from arca.protocol import ErrorReply, Status
from arca_harness import run

OK = Status("OK")


def _log_everything(ctx) -> None:
    assert run(ctx, "CONFIG", "SET", "slowlog-log-slower-than", "0") == OK
    run(ctx, "SLOWLOG", "RESET")


def test_every_command_is_logged_newest_first(ctx):
    ctx.client.addr, ctx.client.name = "127.0.0.1:5555", b"me"
    _log_everything(ctx)
    run(ctx, "SET", "k", "v")
    run(ctx, "GET", "k")
    entries = run(ctx, "SLOWLOG", "GET")
    assert [entry[3] for entry in entries] == [[b"GET", b"k"], [b"SET", b"k", b"v"], [b"SLOWLOG", b"RESET"]]
    newest = entries[0]
    assert newest[0] > entries[1][0] and isinstance(newest[1], int) and newest[2] >= 0
    assert newest[4:] == [b"127.0.0.1:5555", b"me"]
    assert len(run(ctx, "SLOWLOG", "GET", "1")) == 1
    assert len(run(ctx, "SLOWLOG", "GET", "-1")) == run(ctx, "SLOWLOG", "LEN") - 1  # GET itself came after


def test_long_commands_are_cut_as_redis_cuts_them(ctx):
    _log_everything(ctx)
    run(ctx, "SET", "k", "v" * 200)
    run(ctx, "DEL", *[f"k{i}" for i in range(40)])
    deleted, stored = run(ctx, "SLOWLOG", "GET", "2")
    assert stored[3][2] == b"v" * 128 + b"... (72 more bytes)"
    assert len(deleted[3]) == 32 and deleted[3][-1] == b"... (10 more arguments)"
    assert deleted[3][30] == b"k29"


def test_threshold_max_len_and_reset(ctx):
    run(ctx, "CONFIG", "SET", "slowlog-max-len", "2")
    _log_everything(ctx)
    for i in range(5):
        run(ctx, "SET", f"k{i}", "v")
    assert run(ctx, "SLOWLOG", "LEN") == 2
    run(ctx, "CONFIG", "SET", "slowlog-log-slower-than", "-1")
    run(ctx, "SLOWLOG", "RESET")
    run(ctx, "SET", "x", "y")
    assert run(ctx, "SLOWLOG", "LEN") == 0
    run(ctx, "CONFIG", "SET", "slowlog-log-slower-than", "100000000")
    run(ctx, "SET", "x", "y")
    assert run(ctx, "SLOWLOG", "LEN") == 0
    assert run(ctx, "CONFIG", "GET", "slowlog-*") == {b"slowlog-log-slower-than": b"100000000", b"slowlog-max-len": b"2"}
    assert run(ctx, "CONFIG", "SET", "slowlog-max-len", "-1") == ErrorReply(
        "ERR CONFIG SET failed (possibly related to argument 'slowlog-max-len') - argument must be between 0 and "
        "9223372036854775807 inclusive")
    assert run(ctx, "SLOWLOG", "GET", "-2") == ErrorReply("ERR count should be greater than or equal to -1")


def test_exec_logs_the_commands_it_runs_not_itself(ctx):
    _log_everything(ctx)
    run(ctx, "MULTI")
    run(ctx, "SET", "a", "1")
    run(ctx, "INCR", "a")
    run(ctx, "EXEC")
    logged = [entry[3][0] for entry in run(ctx, "SLOWLOG", "GET", "-1")]
    assert logged[:2] == [b"INCR", b"SET"] and b"EXEC" not in logged


def test_plain_commands_are_timed_while_the_threshold_is_low(arca):
    client = redis.Redis(host=arca.host, port=arca.port)
    client.config_set("slowlog-log-slower-than", 0)
    client.slowlog_reset()
    sock = arca.connect()
    sock.sendall(b"*3\r\n$3\r\nSET\r\n$1\r\np\r\n$1\r\n1\r\n*2\r\n$3\r\nGET\r\n$1\r\np\r\n*2\r\n$4\r\nINCR\r\n$1\r\np\r\n")
    data = b""
    while data.count(b"\r\n") < 4:
        data += sock.recv(4096)
    sock.close()
    commands = [entry["command"] for entry in client.slowlog_get(-1)]
    assert commands[:3] == [b"INCR p", b"GET p", b"SET p 1"]
    client.config_set("slowlog-log-slower-than", 10000)
    client.close()


def test_resetstat_zeroes_the_keyspace_counters(ctx):
    run(ctx, "SET", "k", "v")
    run(ctx, "GET", "k")
    run(ctx, "GET", "missing")
    assert "keyspace_hits:1\r\n" in run(ctx, "INFO", "stats").decode()
    assert run(ctx, "CONFIG", "RESETSTAT") == OK
    stats = run(ctx, "INFO", "stats").decode()
    assert "keyspace_hits:0\r\n" in stats and "keyspace_misses:0\r\n" in stats
    run(ctx, "GET", "k")
    assert "keyspace_hits:1\r\n" in run(ctx, "INFO", "stats").decode()


def test_info_cpu(ctx):
    cpu = run(ctx, "INFO", "cpu").decode()
    assert cpu.startswith("# CPU\r\n")
    fields = dict(line.split(":") for line in cpu.split("\r\n")[1:] if line)
    assert list(fields) == ["used_cpu_sys", "used_cpu_user", "used_cpu_sys_children", "used_cpu_user_children",
                            "used_cpu_sys_main_thread", "used_cpu_user_main_thread"]
    assert all(float(value) >= 0 for value in fields.values())
    assert "# CPU\r\n" in run(ctx, "INFO").decode()


def test_redis_py_reads_info_cpu_and_slowlog(arca):
    for protocol in (2, 3):
        client = redis.Redis(host=arca.host, port=arca.port, protocol=protocol)
        assert client.info("cpu")["used_cpu_user"] >= 0
        assert client.slowlog_len() >= 0
        client.close()


def test_slowlog_settings_come_from_the_config_file(tmp_path):
    from arca.config import load_config
    from arca.daemon import server_options
    from arca.state import ServerState
    from shared.config import ConfigError

    conf = tmp_path / "arca.conf"
    conf.write_text("[server]\nslowlog-log-slower-than = 0\nslowlog-max-len = 5\n")
    state = ServerState.from_options(server_options(load_config(file=conf, env={})))
    assert (state.slowlog.log_slower_than_us, state.slowlog.max_len) == (0, 5)
    conf.write_text("[server]\nslowlog-max-len = -1\n")
    try:
        load_config(file=conf, env={})
    except ConfigError as error:
        assert "slowlog-max-len" in str(error)
    else:
        raise AssertionError("a negative slowlog-max-len was accepted")


def test_passwords_never_reach_the_slow_log(ctx):
    _log_everything(ctx)
    run(ctx, "AUTH", "default", "secret")
    run(ctx, "HELLO", "2", "AUTH", "default", "secret", "SETNAME", "n")
    run(ctx, "CONFIG", "SET", "requirepass", "secret", "maxclients", "100")
    run(ctx, "CONFIG", "SET", "requirepass", "")
    logged = [entry[3] for entry in run(ctx, "SLOWLOG", "GET", "4")]
    assert logged == [
        [b"CONFIG", b"SET", b"requirepass", b"(redacted)"],
        [b"CONFIG", b"SET", b"requirepass", b"(redacted)", b"maxclients", b"100"],
        [b"HELLO", b"2", b"AUTH", b"(redacted)", b"(redacted)", b"SETNAME", b"n"],
        [b"AUTH", b"(redacted)", b"(redacted)"],
    ]
