"""Runs the node's batches: validate, run every line, finalize; resumes after a restart.

One task per node takes the batches with work left, oldest first, one at a time. A
`validating` batch has its input file checked line by line (node/batches/validation.py)
and becomes `in_progress` with its lines, or `failed` with the errors. The lines still
`done = 0` run through the `LineExecutor` (the API's parser and the service, at batch
priority, for the tenant that created the batch), at most `concurrency` at once and in input order of starting; each result is
committed as it ends, so a killed node resumes with exactly the unfinished lines. A line
the engine has no room for (overloaded) is tried again after `retry_s`; any other failure
of a line is that line's error, and the batch goes on. A result that would take the stored
bytes past `[batch] max_storage_mb` fails the whole batch (`storage_full`): the lines in
flight are stopped and its results dropped; the node and the other batches go on.
Validation reads and parses the input on a thread of its own, so the store's one thread
(every files and batches route) never waits for it. With nothing left the batch is
`finalizing`, then `completed` with its output and error files written in input order.

Cancelling (`cancel()`): the lines in flight are stopped (they stay unfinished), the batch
becomes `cancelled` with the results it has. Closing the runner stops the lines in flight
the same way, leaving the batch `in_progress` for the next start.
"""

from __future__ import annotations

import asyncio
import logging

from node.batches.errors import StorageFull
from node.batches.lines import InputLine, LineExecutor, output_line
from node.batches.store import BatchRecord, BatchStore
from node.batches.validation import read_lines

log = logging.getLogger(__name__)
PAGE = 256  # pending lines read from the store at a time


class BatchRunner:
    def __init__(self, store: BatchStore, executor: LineExecutor, *, concurrency: int, max_lines: int,
                 retry_s: float = 1.0) -> None:
        self.store = store
        self.executor = executor
        self.concurrency = max(1, concurrency)
        self.max_lines = max_lines
        self.retry_s = retry_s
        self._wake = asyncio.Event()
        self._cancelled: set[str] = set()
        self._full: dict[str, str] = {}  # batches whose results reached the storage budget: why
        self._task: asyncio.Task[None] | None = None
        self._current: str | None = None
        self._in_flight: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._main(), name="reame-batches")

    def wake(self) -> None:
        self._wake.set()

    def cancel(self, batch_id: str) -> None:
        """Stop the batch's lines in flight (the store already says `cancelling`)."""
        self._cancelled.add(batch_id)
        if self._current == batch_id:
            for task in list(self._in_flight):
                task.cancel()
        self.wake()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _main(self) -> None:
        while True:
            self._wake.clear()
            for batch_id in await self.store.call(self.store.active_batches):
                try:
                    await self._run(batch_id)
                except asyncio.CancelledError:
                    raise
                except Exception:  # a bug or a broken disk: logged, retried at the next wake
                    log.exception("batch %s could not run", batch_id)
            await self._wake.wait()

    async def _run(self, batch_id: str) -> None:
        batch = await self.store.call(self.store.get_batch, batch_id)
        if batch is None:
            return
        if batch.status == "validating":
            batch = await self._validate(batch_id, str(batch.row["input_file_id"]), str(batch.row["endpoint"]))
        if batch.status == "in_progress" and batch_id not in self._cancelled:
            await self._run_lines(batch_id, str(batch.row.get("tenant") or ""))
            full = self._full.pop(batch_id, None)
            if full is not None:
                log.warning("batch %s failed: %s", batch_id, full)
                await self.store.call(self.store.fail_running, batch_id, [
                    {"code": "storage_full", "message": full, "param": None, "line": None}])
                self._cancelled.discard(batch_id)
                return
            await self.store.call(self.store.mark_finalizing, batch_id)
        final = await self.store.call(self.store.finalize, batch_id)
        if final.status in ("completed", "cancelled"):
            counts = final.to_object()["request_counts"]
            log.info("batch %s %s: %d lines, %d completed, %d failed", batch_id, final.status, counts["total"],
                     counts["completed"], counts["failed"])
        if final.status not in ("in_progress", "finalizing", "cancelling"):
            self._cancelled.discard(batch_id)

    async def _validate(self, batch_id: str, file_id: str, endpoint: str) -> BatchRecord:
        path = self.store.file_path(file_id)
        try:  # on a thread of its own: parsing every line's body must not hold the store's thread
            lines, errors = await asyncio.to_thread(read_lines, path, endpoint, self.executor, self.max_lines)
        except FileNotFoundError:
            lines, errors = [], [{"code": "file_not_found", "message": f"The input file {file_id} was deleted",
                                  "param": "input_file_id", "line": None}]
        if errors:
            log.info("batch %s failed validation: %d errors, first: %s", batch_id, len(errors), errors[0]["message"])
            return await self.store.call(self.store.fail_batch, batch_id, errors)
        return await self.store.call(self.store.start_batch, batch_id, lines)

    async def _run_lines(self, batch_id: str, tenant: str) -> None:
        self._current = batch_id
        room = asyncio.Semaphore(self.concurrency)
        after = 0
        try:
            while batch_id not in self._cancelled and batch_id not in self._full:
                page = await self.store.call(self.store.pending_lines, batch_id, after, PAGE)
                if not page:
                    break
                for line in page:
                    await room.acquire()
                    if batch_id in self._cancelled or batch_id in self._full:
                        room.release()
                        break
                    task = asyncio.create_task(self._line(batch_id, line, tenant))
                    self._in_flight.add(task)

                    def done(task: asyncio.Task[None]) -> None:
                        self._in_flight.discard(task)
                        room.release()
                    task.add_done_callback(done)
                after = page[-1].number
            await asyncio.gather(*self._in_flight, return_exceptions=True)
        finally:
            for task in list(self._in_flight):
                task.cancel()
            await asyncio.gather(*self._in_flight, return_exceptions=True)
            self._current = None

    async def _line(self, batch_id: str, line: InputLine, tenant: str) -> None:
        while True:
            result = await self.executor.run(line.url, line.body, tenant)
            if not result.retry:
                break
            await asyncio.sleep(self.retry_s)
        try:
            await self.store.call(self.store.finish_line, batch_id, line.number, result.ok,
                                  output_line(line.custom_id, result))
        except StorageFull as exc:  # the batch fails, the node goes on
            self._full.setdefault(batch_id, exc.message)
            for task in list(self._in_flight):
                if task is not asyncio.current_task():
                    task.cancel()
