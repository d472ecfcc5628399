"""Every line of a batch input file checked before the batch starts.

`check_upload(path, max_lines)` runs when a file is uploaded with purpose `batch`: UTF-8
JSON Lines, one object per non-blank line, at most `max_lines` of them; the first bad line
is refused with its number. `read_lines(path, endpoint, executor)` runs when a batch is
created (on the store's thread): every line must have a unique non-empty string
`custom_id`, `method` POST, the batch's `url`, and a `body` the live endpoint's parser
accepts (`executor.check`, so a line is refused for exactly what the endpoint would refuse;
`stream: true` is refused too). Any bad line fails the whole batch with a list of errors
naming each line, as OpenAI's Batch API does; what can only be judged while running (a
prompt too long for the context) fails that line alone, in the error file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import orjson

from node.batches.lines import InputLine, LineExecutor
from node.serving.errors import InvalidRequest, ServingError

MAX_REPORTED = 100  # errors listed per batch; the count says how many there were


def _objects(path: Path) -> Iterator[tuple[int, Any, bytes]]:
    """(line number, parsed value or the parse error, raw bytes) of every non-blank line."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            raw = raw.strip()
            if not raw:
                continue
            try:
                yield number, orjson.loads(raw), raw
            except orjson.JSONDecodeError as exc:
                yield number, exc, raw


def check_upload(path: Path, max_lines: int) -> None:
    """Raise InvalidRequest (naming the line) unless the file is JSON Lines of objects."""
    count = 0
    for number, value, _ in _objects(path):
        count += 1
        if isinstance(value, orjson.JSONDecodeError):
            raise InvalidRequest(f"Line {number} of the file is not valid JSON: {value}", param="file",
                                 code="invalid_jsonl")
        if not isinstance(value, dict):
            raise InvalidRequest(f"Line {number} of the file is not a JSON object", param="file",
                                 code="invalid_jsonl")
        if count > max_lines:
            raise InvalidRequest(f"The file holds more than {max_lines} requests ([batch] max_lines)",
                                 param="file", code="too_many_lines")
    if count == 0:
        raise InvalidRequest("The file holds no requests", param="file", code="empty_file")


def _error(number: int, code: str, message: str, param: str | None = None) -> dict[str, Any]:
    return {"code": code, "message": f"Line {number}: {message}", "param": param, "line": number}


def _check_line(number: int, value: Any, endpoint: str, executor: LineExecutor, seen: set[str]) -> dict | None:
    if isinstance(value, orjson.JSONDecodeError):
        return _error(number, "invalid_json_line", f"not valid JSON ({value})")
    if not isinstance(value, dict):
        return _error(number, "invalid_json_line", "not a JSON object")
    custom_id = value.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return _error(number, "missing_custom_id", "'custom_id' must be a non-empty string", "custom_id")
    if custom_id in seen:
        return _error(number, "duplicate_custom_id", f"'custom_id' {custom_id!r} is used by an earlier line",
                      "custom_id")
    seen.add(custom_id)
    if value.get("method") != "POST":
        return _error(number, "invalid_method", "'method' must be \"POST\"", "method")
    if value.get("url") != endpoint:
        return _error(number, "mismatched_endpoint", f"'url' must be the batch's endpoint {endpoint!r}, "
                      f"got {value.get('url')!r}", "url")
    body = value.get("body")
    if not isinstance(body, dict):
        return _error(number, "invalid_body", "'body' must be a JSON object", "body")
    if body.get("stream"):
        return _error(number, "invalid_body", "'body.stream' cannot be true in a batch", "body.stream")
    if "session" in body:
        return _error(number, "invalid_body", "'body.session' cannot be used in a batch: each line is a request "
                      "of its own, outside any session", "body.session")
    try:
        executor.check(endpoint, body)
    except ServingError as exc:
        return _error(number, exc.code or "invalid_body", exc.message, f"body.{exc.param}" if exc.param else "body")
    return None


def read_lines(path: Path, endpoint: str, executor: LineExecutor,
               max_lines: int) -> tuple[list[InputLine], list[dict[str, Any]]]:
    """The batch's lines, or the errors that refuse it (lines numbered from 1)."""
    lines: list[InputLine] = []
    errors: list[dict[str, Any]] = []
    bad = 0
    seen: set[str] = set()
    for number, value, raw in _objects(path):
        if len(lines) + bad >= max_lines:
            return [], [_error(number, "too_many_lines", f"the file holds more than {max_lines} requests "
                               "([batch] max_lines)")]
        error = _check_line(number, value, endpoint, executor, seen)
        if error is not None:
            bad += 1
            if len(errors) < MAX_REPORTED:
                errors.append(error)
            continue
        lines.append(InputLine(number, value["custom_id"], endpoint, orjson.dumps(value["body"])))
    if not lines and not errors:
        errors.append({"code": "empty_file", "message": "The input file holds no requests", "param": None,
                       "line": None})
    if bad > MAX_REPORTED:
        errors.append({"code": "more_errors", "message": f"{bad - MAX_REPORTED} more lines failed validation",
                       "param": None, "line": None})
    return (lines if not errors else []), errors
