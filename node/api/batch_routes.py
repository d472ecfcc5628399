"""The Batch API's routes: OpenAI's files and batches.

Files: `POST /v1/files` (multipart: `purpose` = batch, `file` = JSON Lines; streamed to
disk under the `[batch]` byte budgets, checked line by line), `GET /v1/files` (newest
first; `purpose`, `limit`, `after`), `GET /v1/files/{id}`, `GET /v1/files/{id}/content`,
`DELETE /v1/files/{id}`. Batches: `POST /v1/batches` (`input_file_id`, `endpoint`,
`completion_window` = 24h, `metadata`), `GET /v1/batches` (`limit`, `after`),
`GET /v1/batches/{id}`, `POST /v1/batches/{id}/cancel`. Objects and statuses are OpenAI's;
the work is done by node/batches (store, validation, runner). Each key (tenant, node/serving/
tenants.py) sees only its own files and batches: another key's ids are 404 and absent from lists.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError

from node.api.cache_routes import client_of
from node.api.routes import json_response, read_json
from node.api.state import STATE, tenant_of
from node.batches.errors import BatchConflict
from node.batches.lines import ENDPOINTS
from node.batches.runner import BatchRunner
from node.batches.store import FileRecord
from node.batches.validation import check_upload
from node.serving.errors import InvalidRequest, NotFound, UnsupportedFeature
from shared.text import clip

PURPOSES = ("batch",)
WINDOWS = ("24h",)
MAX_METADATA = 16
CHUNK = 256 * 1024


def runner_of(request: web.Request) -> BatchRunner:
    runner = request.app[STATE].batches
    if runner is None:
        raise NotFound("The Batch API is not running on this node")
    return runner


def limit_of(request: web.Request, default: int = 20) -> int:
    text = request.query.get("limit", str(default))
    # ASCII digits only: str.isdigit() also admits superscripts, which int() refuses
    if not (text.isascii() and text.isdigit() and len(text) <= 5) or not 1 <= int(text) <= 10_000:
        raise InvalidRequest("'limit' must be an integer from 1 to 10000", param="limit")
    return int(text)


def listing(objects: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    shown = objects[:limit]
    return {"object": "list", "data": shown, "first_id": shown[0]["id"] if shown else None,
            "last_id": shown[-1]["id"] if shown else None, "has_more": len(objects) > limit}


# ---- files ---------------------------------------------------------------------------------


async def upload_file(request: web.Request) -> web.Response:
    runner = runner_of(request)
    if not request.content_type.startswith("multipart/"):
        raise InvalidRequest("Upload the file as multipart/form-data with fields 'purpose' and 'file'",
                             code="invalid_upload")
    try:
        record = await receive(request, runner)
    except (ValueError, AssertionError, UnicodeDecodeError, HttpProcessingError) as exc:  # a malformed form
        raise InvalidRequest(f"The multipart body could not be read: {exc}", code="invalid_upload") from None
    if record is None:
        raise InvalidRequest("The upload has no 'file' field", param="file")
    return json_response(record.to_object())


async def receive(request: web.Request, runner: BatchRunner) -> FileRecord | None:
    """Read the form: `purpose` first, then `file` streamed into the store."""
    store = runner.store
    reader = await request.multipart()
    purpose: str | None = None
    record: FileRecord | None = None
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader):
            continue
        if part.name == "purpose":
            purpose = (await part.text()).strip()
        elif part.name == "file":
            if record is not None:  # the first is not kept: the request is refused as a whole
                await store.call(store.delete_file, record.id)
                raise InvalidRequest("The upload has more than one 'file' field: send one file per request",
                                     param="file", code="invalid_upload")
            if purpose not in PURPOSES:
                raise InvalidRequest(f"'purpose' must be one of {', '.join(PURPOSES)} (sent before 'file'), "
                                     f"got {purpose!r}", param="purpose")
            upload = await store.begin_upload(client_of(request), tenant_of(request))
            try:
                while chunk := await part.read_chunk(CHUNK):
                    await upload.write(chunk)
                max_lines = runner.max_lines
                record = await upload.commit(part.filename or "input.jsonl", purpose,
                                             lambda path: check_upload(path, max_lines))
            except BaseException:
                await upload.abort()
                raise
    return record


async def file_record(request: web.Request) -> FileRecord:
    store = runner_of(request).store
    file_id = request.match_info["file_id"]
    record = await store.call(store.get_file, file_id, tenant_of(request))
    if record is None:
        raise NotFound(f"No file with id '{clip(file_id)}'", code="file_not_found", param="file_id")
    return record


async def list_files(request: web.Request) -> web.Response:
    store = runner_of(request).store
    limit = limit_of(request, 10_000)
    records = await store.call(store.list_files, request.query.get("purpose"), limit + 1, request.query.get("after"),
                               tenant_of(request))
    return json_response(listing([record.to_object() for record in records], limit))


async def get_file(request: web.Request) -> web.Response:
    return json_response((await file_record(request)).to_object())


async def file_content(request: web.Request) -> web.FileResponse:
    record = await file_record(request)
    path = runner_of(request).store.file_path(record.id)
    return web.FileResponse(path, headers={"Content-Type": "application/octet-stream",
                                           "Content-Disposition": content_disposition(record.filename)})


def content_disposition(filename: str) -> str:
    """An attachment header for any stored name (RFC 6266): a plain ASCII `filename` without
    quotes, backslashes or control characters, and the exact name as `filename*` in UTF-8."""
    plain = "".join(c if " " <= c <= "~" and c not in '"\\' else "_" for c in filename) or "download"
    exact = urllib.parse.quote(filename, safe="")
    return f"attachment; filename=\"{plain}\"; filename*=UTF-8''{exact}"


async def delete_file(request: web.Request) -> web.Response:
    record = await file_record(request)
    store = runner_of(request).store
    await store.call(store.delete_file, record.id)
    return json_response({"id": record.id, "object": "file", "deleted": True})


# ---- batches -------------------------------------------------------------------------------


def parse_metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > MAX_METADATA or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512 for k, v in value.items()):
        raise InvalidRequest(f"'metadata' must map at most {MAX_METADATA} keys (64 characters) to strings "
                             "(512 characters)", param="metadata")
    return value


async def create_batch(request: web.Request) -> web.Response:
    runner = runner_of(request)
    store = runner.store
    body, _ = await read_json(request)
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object")
    file_id = body.get("input_file_id")
    if not isinstance(file_id, str) or not file_id:
        raise InvalidRequest("'input_file_id' is required (an id from POST /v1/files)", param="input_file_id")
    endpoint = body.get("endpoint")
    if endpoint not in ENDPOINTS:
        if isinstance(endpoint, str) and endpoint.startswith("/v1/"):
            raise UnsupportedFeature(f"Batches of {endpoint} are not supported; use {' or '.join(ENDPOINTS)}",
                                     param="endpoint")
        raise InvalidRequest(f"'endpoint' must be one of {', '.join(ENDPOINTS)}", param="endpoint")
    window = body.get("completion_window", "24h")
    if window not in WINDOWS:
        raise InvalidRequest("'completion_window' must be \"24h\"", param="completion_window")
    metadata = parse_metadata(body.get("metadata"))
    record = await store.call(store.get_file, file_id, tenant_of(request))
    if record is None:
        raise NotFound(f"No file with id '{clip(file_id)}'", code="file_not_found", param="input_file_id")
    if record.purpose != "batch":
        raise InvalidRequest(f"The file '{file_id}' was not uploaded with purpose 'batch'", param="input_file_id")
    batch = await store.call(store.create_batch, file_id, endpoint, window, metadata, tenant_of(request))
    runner.wake()
    return json_response(batch.to_object())


async def get_batch(request: web.Request) -> web.Response:
    store = runner_of(request).store
    batch_id = request.match_info["batch_id"]
    batch = await store.call(store.get_batch, batch_id, tenant_of(request))
    if batch is None:
        raise NotFound(f"No batch with id '{clip(batch_id)}'", code="batch_not_found", param="batch_id")
    return json_response(batch.to_object())


async def list_batches(request: web.Request) -> web.Response:
    store = runner_of(request).store
    limit = limit_of(request)
    batches = await store.call(store.list_batches, limit + 1, request.query.get("after"), tenant_of(request))
    return json_response(listing([batch.to_object() for batch in batches], limit))


async def cancel_batch(request: web.Request) -> web.Response:
    runner = runner_of(request)
    store = runner.store
    batch_id = request.match_info["batch_id"]
    batch = await store.call(store.request_cancel, batch_id, tenant_of(request))
    if batch is None:
        raise NotFound(f"No batch with id '{clip(batch_id)}'", code="batch_not_found", param="batch_id")
    if batch.status not in ("cancelling", "cancelled"):
        raise BatchConflict(f"A batch that is {batch.status} cannot be cancelled", param="batch_id")
    runner.cancel(batch_id)
    return json_response(batch.to_object())


def setup_batch_routes(app: web.Application) -> None:
    app.router.add_post("/v1/files", upload_file)
    app.router.add_get("/v1/files", list_files)
    app.router.add_get("/v1/files/{file_id}", get_file)
    app.router.add_get("/v1/files/{file_id}/content", file_content)
    app.router.add_delete("/v1/files/{file_id}", delete_file)
    app.router.add_post("/v1/batches", create_batch)
    app.router.add_get("/v1/batches", list_batches)
    app.router.add_get("/v1/batches/{batch_id}", get_batch)
    app.router.add_post("/v1/batches/{batch_id}/cancel", cancel_batch)
