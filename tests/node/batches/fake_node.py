"""A node process on the fake engine (tests/node/fake_engine.py), for tests that kill it.

    python -m tests.node.batches.fake_node HOME PORT SUBMIT_LOG

Serves the real app on 127.0.0.1:PORT with REAME_HOME=HOME; the fake answers at 10 ms a
token, and every request that reaches it has its prompt text appended to SUBMIT_LOG (one
line, flushed), so a test can tell which batch lines a process started.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from node.api.app import create_app
from node.api.runner import start_site
from tests.node.api.live import node_settings
from tests.node.fake_engine import FakeEngine


class LoggingEngine(FakeEngine):
    def __init__(self, model_path: Path, log_path: Path) -> None:
        super().__init__(model_path)
        self.log = open(log_path, "a", encoding="utf-8")
        self.token_delay_s = 0.01

    def submit_n(self, req, n, loop=None):
        handles = super().submit_n(req, n, loop)
        self.log.write(self.detokenize(req.prompt_tokens).decode("utf-8", "replace").replace("\n", " ") + "\n")
        self.log.flush()
        return handles


async def main(home: Path, port: int, log_path: Path) -> None:
    engine = LoggingEngine(home / "fake.gguf", log_path)
    settings = node_settings(engine.config.model_path, home, **{"arca.observe": False, "server.port": port})
    runner, _ = await start_site(create_app(settings, engine=engine), "127.0.0.1", port)
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])))
