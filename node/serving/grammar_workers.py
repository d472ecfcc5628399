"""Grammar work off the event loop: threads of the node's own, with large stacks and a time budget.

Checking a schema (jsonschema's meta-schema, llguidance's compile) and compiling a grammar
against the vocabulary cost from microseconds to seconds, and llguidance recurses on the
calling thread's stack. `GrammarWorkers` runs that work on `threads` threads created with a
`STACK_BYTES` stack (the limits of node/serving/schema_limits.py keep the recursion far below
even a default stack; this is the margin), never on the event loop, the engine thread or the
batch store's thread.

Each piece of work has a time budget, counted from when it was handed over:
- it ran past the budget: `InvalidRequest` (400) "took longer than ... to check", naming the
  field; the thread finishes it in the background (llguidance cannot be interrupted), and
  nothing of it is kept;
- it waited past the budget without starting (the threads were busy): `Overloaded` (503),
  and it never runs.
`await run(...)` serves the event loop; `call(...)` a thread that may block (batch validation).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from typing import Any, Callable, TypeVar

from node.serving.errors import InvalidRequest, Overloaded

STACK_BYTES = 64 * 2**20
BUDGET_S = 10.0
THREADS = 2
_STACK_SIZE_LOCK = threading.Lock()  # threading.stack_size is process-wide: set it, start, restore
T = TypeVar("T")
_Job = tuple[Callable[..., Any], tuple[Any, ...], "concurrent.futures.Future[Any]"]


class GrammarWorkers:
    def __init__(self, *, threads: int = THREADS, budget_s: float = BUDGET_S, stack_bytes: int = STACK_BYTES) -> None:
        self.budget_s = budget_s
        self._count = max(1, threads)
        self._stack_bytes = stack_bytes
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._start_lock = threading.Lock()

    def _start(self) -> None:
        """The threads, on first use (a node that never sees a schema starts none); under _start_lock."""
        with _STACK_SIZE_LOCK:
            previous = threading.stack_size(self._stack_bytes)
            try:
                for number in range(self._count):
                    thread = threading.Thread(target=self._main, args=(self._jobs,), name=f"reame-grammar-{number}",
                                              daemon=True)
                    thread.start()
                    self._threads.append(thread)
            finally:
                threading.stack_size(previous)

    @staticmethod
    def _main(jobs: queue.SimpleQueue[_Job | None]) -> None:
        while True:
            job = jobs.get()
            if job is None:
                return
            fn, args, future = job
            if not future.set_running_or_notify_cancel():  # its waiter gave up before it started
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to the waiter, who raises it
                future.set_exception(exc)

    def submit(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._start_lock:
            if not self._threads:
                self._start()
            self._jobs.put((fn, args, future))
        return future

    def _over_budget(self, future: concurrent.futures.Future[Any], param: str | None) -> Exception:
        if future.cancel():  # never started: the threads are busy
            return Overloaded("The node is busy checking other grammars; retry shortly")
        field = f"'{param}'" if param else "The grammar"
        return InvalidRequest(f"{field} took longer than {self.budget_s:g} s to check and compile: make the "
                              "schema or grammar smaller or simpler", param=param,
                              code="invalid_grammar" if param == "grammar" else "invalid_schema")

    async def run(self, param: str | None, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on a grammar thread, awaited within the budget."""
        future = self.submit(fn, *args)
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), self.budget_s)
        except asyncio.TimeoutError:
            raise self._over_budget(future, param) from None

    def call(self, param: str | None, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on a grammar thread, waited for (blocking) within the budget."""
        future = self.submit(fn, *args)
        try:
            return future.result(self.budget_s)
        except concurrent.futures.TimeoutError:
            raise self._over_budget(future, param) from None

    def close(self) -> None:
        """Stop the threads once the work handed to them is done (work still queued is done first)."""
        with self._start_lock:
            for _ in self._threads:
                self._jobs.put(None)
            self._threads = []
            self._jobs = queue.SimpleQueue()  # threads started later take their work from a queue of their own
