"""A live node for tests: the real app on a real loopback socket, in a thread of its own.

The node runs its own event loop in a background thread, so synchronous clients (the
official `openai` package, headless Chromium) and async test functions can both talk to it
over HTTP exactly as users do. `node_settings` builds real NodeSettings for the model;
`drafting_node` starts one whose speculation does not depend on the machine's load; `settled`
waits for a node's engine to finish what it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from node.api.app import create_app
from node.api.runner import start_site
from node.api.state import STATE
from node.config import load_settings


def node_settings(model: Path, home: Path, **flags: Any) -> Any:
    """Settings of a small test node: 4096-token context, 4 slots (1024 tokens per sequence: a
    test document of 500 tokens and its answer fit one), no prefix cache, serving without
    measuring the step costs first."""
    base = {"model.path": str(model), "model.context_length": 4096, "server.parallel": 4,
            "cache.enabled": False, "speculative.measure_first": False}  # serve at once (tests/conftest.py)
    return load_settings(None, {**base, **flags}, env={"REAME_HOME": str(home)})


class LiveNode:
    def __init__(self, settings: Any, *, engine: Any = None, archive: Any = None) -> None:
        self.settings = settings
        self.engine = engine
        self.archive = archive
        self.port = 0
        self.app = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="live-node", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def state(self):
        return self.app[STATE]

    def start(self, timeout: float = 120) -> "LiveNode":
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("the node did not start")
        if self._error is not None:
            raise self._error
        return self

    def call(self, coro, timeout: float = 60):
        """Run a coroutine on the node's loop (e.g. draining its archive writes)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)

    def _main(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            self.app = create_app(self.settings, engine=self.engine, archive=self.archive)
            runner, self.port = await start_site(self.app, "127.0.0.1", 0)
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def __enter__(self) -> "LiveNode":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def http_json(method: str, url: str, body: Any = None, headers: dict | None = None,
              timeout: float = 120) -> tuple[int, dict, Any]:
    """One JSON request with the standard library: (status, headers, parsed body)."""
    import urllib.error
    import urllib.request

    import orjson

    request = urllib.request.Request(url, method=method, data=orjson.dumps(body) if body is not None else None,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, dict(response.headers), orjson.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), orjson.loads(exc.read())


def metric(url: str, name: str, *, headers: dict | None = None, **labels: str) -> float:
    """The value of one series on the node's /metrics (0 when absent); `headers` carry the
    bearer key of a node that requires one."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    request = urllib.request.Request(f"{url}/metrics", headers=headers or {})
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


@contextlib.contextmanager
def drafting_node(settings: Any) -> Iterator[LiveNode]:
    """A live node on the loader's engine, prefix cache (when enabled) and speculation controller,
    with a fixed verify cost line, so that what is drafted does not depend on the machine's load."""
    from node.engine.engine import Engine
    from node.assembly import build_prefix_cache, build_speculator, engine_config
    from node.models.loader import plan_engine
    from node.speculative.costs import CostCurve

    plan = plan_engine(settings, progress=False)
    cache = build_prefix_cache(settings, plan)
    controller = build_speculator(settings, plan)
    assert controller is not None
    controller.costs = CostCurve({1: 0.0126, 8: 0.0150}, fixed=True)
    engine = Engine(engine_config(settings, plan, cache, speculator=controller))
    controller.bind_vocabulary(engine.token_piece, lambda text: engine.tokenize(text, add_bos=False, special=False))
    engine.warm_grammars()  # now, not on a worker thread beside the first requests' decode threads
    live = LiveNode(settings, engine=engine).start()
    try:
        yield live
    finally:
        live.stop()
        engine.close()
        if cache is not None:
            cache.close()


def settled(node: LiveNode, timeout: float = 10.0) -> dict:
    """The engine's stats once nothing is active or queued (or at the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = node.state.engine.stats()
        if (stats["active"] == 0 and stats["queued"] == 0) or time.monotonic() > deadline:
            return stats
        time.sleep(0.02)
