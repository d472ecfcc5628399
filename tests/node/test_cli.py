"""The `reame` command as a user meets it: real processes, the real Gemma model, a real pty."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def reame(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "node.cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def test_bare_reame_prints_version_and_examples():
    result = reame()
    assert result.returncode == 0
    assert result.stdout.startswith("reame 0.")
    assert result.stdout.count("  reame ") == 3


def test_list_shows_the_catalog_and_what_is_on_disk(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    (models / "qwen2.5-3b-instruct-q4_k_m.gguf").write_bytes(b"GGUF")
    (models / "my-own.gguf").write_bytes(b"GGUF")
    result = reame("list", env={"REAME_HOME": str(tmp_path), "COLUMNS": "160"})
    assert result.returncode == 0, result.stderr
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.count("│") > 2}
    for alias in ("gemma3-270m", "tinyllama", "qwen2.5-0.5b", "qwen2.5-3b", "olmoe", "my-own.gguf"):
        assert alias in rows
    assert "yes" in rows["qwen2.5-3b"] and "yes" in rows["my-own.gguf"]
    assert "downloaded on first run" in rows["tinyllama"]


@pytest.mark.parametrize(
    "args, fragment",
    [
        (("run", "qwen", "hi"), "ambiguous"),
        (("run", "no-such-model", "hi"), "reame list"),
        (("run", "/nowhere/model.gguf", "hi"), "does not exist"),
        (("frobnicate",), "unknown command"),
    ],
)
def test_errors_are_one_clear_line(args, fragment, tmp_path):
    result = reame(*args, env={"REAME_HOME": str(tmp_path)})
    assert result.returncode in (1, 2)
    assert fragment in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_config_errors_name_file_section_and_key(tmp_path):
    conf = tmp_path / "bad.conf"
    conf.write_text("[server]\nport = many\n")
    result = reame("--config", str(conf), "--serve", env={"REAME_HOME": str(tmp_path)})
    assert result.returncode == 1
    assert f"{conf}: [server] port" in result.stderr and "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def gemma_home(gemma_path, tmp_path_factory) -> dict[str, str]:
    """The model's home; an embedded archive of this module's own (a node serving from the home
    holds the home's archive, and `reame run` opens the archive as a server does)."""
    return {"REAME_HOME": str(gemma_path.parent.parent),
            "REAME_ARCA_DIRECTORY": str(tmp_path_factory.mktemp("arca"))}


@pytest.mark.model
def test_one_shot_streams_an_answer(gemma_home):
    result = reame("run", "gemma3", "Name a river of Italy.", "--max-tokens", "8", "--temp", "0",
                   "--ctx", "1024", env=gemma_home)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert re.search(r"\[\d+ prompt \+ [1-8] generated tokens", result.stderr)
    assert "Traceback" not in result.stderr


@pytest.mark.model
def test_conclave_prints_the_winner_and_the_consensus_line(gemma_home):
    result = reame("run", "gemma3", "What is 2 + 2?", "--conclave", "3", "--max-tokens", "6", "--temp", "0",
                   "--ctx", "1024", "--verbose", env=gemma_home)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert re.fullmatch(r"CONCLAVE consensus=[1-3]/3 decision=\w+ started=[23] stopped_early=(yes|no) votes: .*", lines[-1])
    assert len(lines) >= 2 and "Traceback" not in result.stderr
    bad = reame("run", "gemma3", "Hi", "--conclave", "17", env=gemma_home)
    assert bad.returncode == 1 and "--conclave must be between 1 and 16" in bad.stderr


def test_best_of_is_a_deprecated_alias_of_conclave_that_says_so(tmp_path):
    home = {"REAME_HOME": str(tmp_path)}
    old = reame("run", "gemma3", "Hi", "--best-of", "17", env=home)
    assert old.returncode == 1 and "--best-of must be between 1 and 16" in old.stderr
    assert "--best-of is deprecated" in old.stderr and "use --conclave N" in old.stderr
    new = reame("run", "gemma3", "Hi", "--conclave", "17", env=home)
    assert new.returncode == 1 and "--conclave must be between 1 and 16" in new.stderr
    assert "deprecated" not in new.stderr
    both = reame("run", "gemma3", "Hi", "--conclave", "3", "--best-of", "5", env=home)
    assert both.returncode == 1 and "disagree" in both.stderr


@pytest.mark.model
def test_the_terminal_answers_through_the_node_l1_and_l4(gemma_home, tmp_path):
    """`reame run` opens the same node as a server: a greedy question asked again is replayed from
    L1 (the same text, no decode), and the answer was observed into the L4 corpus."""
    from arca.archive import Archive, ArchiveConfig

    env = {**gemma_home, "REAME_ARCA_DIRECTORY": str(tmp_path / "arca"), "REAME_CACHE_DIRECTORY": str(tmp_path / "kv")}
    args = ("run", "gemma3", "Name a river of Italy.", "--max-tokens", "8", "--temp", "0", "--ctx", "1024")
    first = reame(*args, env=env)
    assert first.returncode == 0, first.stderr
    assert re.search(r"\[\d+ prompt \+ [1-8] generated tokens, [\d.]+ tok/s\]", first.stderr)
    again = reame(*args, env=env)
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout
    assert re.search(r"\[\d+ prompt \+ [1-8] generated tokens, replayed from L1\]", again.stderr)
    archive = Archive(ArchiveConfig(directory=tmp_path / "arca"))
    try:
        corpus = archive.info()["arca"]
        assert corpus["corpus_streams"] >= 1 and corpus["corpus_tokens"] > 0
    finally:
        archive.close()


class Terminal:
    """A child process on a pseudo-terminal, read until an expected pattern shows up."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.master, slave = pty.openpty()
        self.process = subprocess.Popen(argv, cwd=REPO, stdin=slave, stdout=slave, stderr=slave,
                                        env={**os.environ, **env, "TERM": "dumb"}, close_fds=True)
        os.close(slave)
        self.seen = ""

    def expect(self, pattern: str, timeout: float = 120) -> re.Match:
        deadline = time.monotonic() + timeout
        while True:
            match = re.search(pattern, self.seen)
            if match:
                self.seen = self.seen[match.end():]
                return match
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.process.poll() is not None and not select.select([self.master], [], [], 0)[0]:
                raise AssertionError(f"never saw {pattern!r}; output so far: {self.seen[-2000:]!r}")
            ready, _, _ = select.select([self.master], [], [], min(remaining, 1.0))
            if ready:
                try:
                    self.seen += os.read(self.master, 4096).decode("utf-8", "replace")
                except OSError:  # the child closed the terminal
                    pass

    def send(self, text: str) -> None:
        os.write(self.master, text.encode())

    def close(self) -> int:
        try:
            return self.process.wait(timeout=30)
        finally:
            os.close(self.master)


@pytest.mark.model
def test_chat_loop_keeps_the_conversation(gemma_home):
    """The same line twice: the second prompt carries the first turn; after /reset it does not."""
    turn = r"\[(\d+) prompt \+ (\d+) generated tokens"
    term = Terminal([sys.executable, "-m", "node.cli", "run", "gemma3-270m", "--temp", "0",
                     "--max-tokens", "12", "--ctx", "1024"], gemma_home)
    try:
        term.expect(r"/reset starts over")
        term.expect(r"> ")
        term.send("Tell me about rivers.\n")
        first = term.expect(turn)
        p1, g1 = int(first[1]), int(first[2])
        term.expect(r"> ")
        term.send("Tell me about rivers.\n")
        p2 = int(term.expect(turn)[1])
        assert p2 > p1 + g1 // 2, (p1, g1, p2)  # the history went into the prompt
        term.expect(r"> ")
        term.send("/reset\n")
        term.expect(r"conversation cleared")
        term.expect(r"> ")
        term.send("Tell me about rivers.\n")
        assert int(term.expect(turn)[1]) == p1  # a fresh conversation again
        term.expect(r"> ")
        term.send("\x04")  # Ctrl-D
        assert term.close() == 0
    finally:
        if term.process.poll() is None:
            term.process.kill()
            term.process.wait()


@pytest.mark.model
def test_config_mode_serves_until_sigint(gemma_home, tmp_path):
    """`reame --config FILE --serve`: model, port and slots come from the file."""
    import signal
    import urllib.request

    from tests.conftest import free_port

    port = free_port()
    conf = tmp_path / "node.conf"
    conf.write_text(f"[model]\npath = gemma3-270m\ncontext_length = 1024\n"
                    f"[server]\nport = {port}\nparallel = 2\n[arca]\ndirectory = {tmp_path / 'arca'}\n"
                    f"[cache]\ndirectory = {tmp_path / 'cache'}\n")
    process = subprocess.Popen([sys.executable, "-m", "node.cli", "--config", str(conf), "--serve"],
                               cwd=REPO, env={**os.environ, **gemma_home}, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                    assert b'"slots_total":2' in response.read()
                    break
            except OSError:
                assert process.poll() is None, process.stdout.read()
                assert time.monotonic() < deadline, "the node never answered /health"
                time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
