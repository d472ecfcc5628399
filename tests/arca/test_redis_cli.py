"""The real redis-cli against ARCA: one-shot commands, --raw, --pipe, and an interactive start."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

REDIS_CLI = shutil.which("redis-cli")
pytestmark = pytest.mark.skipif(REDIS_CLI is None, reason="redis-cli not installed (apt-get install redis-tools)")


def cli(server, *args: str, stdin: bytes | None = None) -> str:
    done = subprocess.run(
        [REDIS_CLI, "-h", server.host, "-p", str(server.port), *args],
        input=stdin, capture_output=True, timeout=30,
    )
    return done.stdout.decode()


def test_one_shot_commands(arca):
    assert cli(arca, "PING") == "PONG\n"
    assert cli(arca, "SET", "greeting", "hello world") == "OK\n"
    assert cli(arca, "GET", "greeting") == "hello world\n"
    assert cli(arca, "GET", "missing") == "\n"  # nil prints as an empty line when not a tty
    assert cli(arca, "INCR", "counter") == "1\n"
    assert cli(arca, "DBSIZE") == "2\n"
    error = cli(arca, "NOSUCH", "a", "b")
    assert error.strip("\n") == "ERR unknown command 'NOSUCH', with args beginning with: 'a' 'b' "


def test_raw_output_is_the_value_bytes(arca):
    cli(arca, "SET", "k", "line1\nline2")
    assert cli(arca, "--raw", "GET", "k") == "line1\nline2\n"
    assert cli(arca, "--no-raw", "GET", "k") == '"line1\\nline2"\n'
    assert cli(arca, "--raw", "MGET", "k", "nope") == "line1\nline2\n\n"


def test_pipe_mass_insertion(arca):
    lines = b"".join(
        b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(k), k, len(v), v)
        for k, v in ((b"key:%d" % i, b"value:%d" % i) for i in range(5000))
    )
    out = cli(arca, "--pipe", stdin=lines)
    assert "errors: 0, replies: 5000" in out
    assert cli(arca, "DBSIZE") == "5000\n"
    assert cli(arca, "GET", "key:4999") == "value:4999\n"


def test_interactive_start_gets_command_docs(arca):
    """Under tmux (a real tty) redis-cli asks COMMAND DOCS on connect and shows our hints."""
    tmux = shutil.which("tmux")
    if tmux is None:
        pytest.skip("tmux not installed")
    session = f"arca-cli-{arca.port}"
    subprocess.run([tmux, "new-session", "-d", "-s", session, "-x", "160", "-y", "20",
                    REDIS_CLI, "-h", arca.host, "-p", str(arca.port)], check=True)
    try:
        def screen() -> str:
            return subprocess.run([tmux, "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout

        def wait_for(text: str) -> str:
            deadline = time.monotonic() + 10
            while text not in (shown := screen()) and time.monotonic() < deadline:
                time.sleep(0.1)
            return shown

        wait_for(f"{arca.port}>")
        # redis-cli's built-in help knows nothing of CLIENT SETINFO (newer than 7.0) or
        # ARCA.*: a hint for them can only come from our COMMAND DOCS reply.
        subprocess.run([tmux, "send-keys", "-t", session, "CLIENT SETINFO "], check=True)
        hinted = wait_for("libname")
        subprocess.run([tmux, "send-keys", "-t", session, "C-u", "SET mykey "], check=True)
        hinted += wait_for("[NX|XX]")
        subprocess.run([tmux, "send-keys", "-t", session, "hello", "Enter"], check=True)
        wait_for("OK")
        subprocess.run([tmux, "send-keys", "-t", session, "GET mykey", "Enter"], check=True)
        final = wait_for('"hello"')
    finally:
        subprocess.run([tmux, "kill-session", "-t", session], capture_output=True)
    assert "CLIENT SETINFO LIB-NAME libname|LIB-VER libver" in hinted
    assert "SET mykey value [NX|XX] [GET]" in hinted
    assert '"hello"' in final
