"""POST /v1/embeddings in OpenAI's shape: parse, ask the service, answer floats or base64.

`input` is a string, an array of strings, an array of token ids (one input) or an array of
arrays of token ids; `encoding_format` "float" (default) or "base64" (the little-endian
float32 bytes of the whole vector, base64-encoded, as OpenAI sends them); `dimensions`
truncates and renormalises (1 to the model's width); `model` must name the served model;
`user` is accepted and ignored. The vectors come from `CompletionService.embed`, which every
API that embeds calls. The answer carries `X-Reame-Cache: hit` when every input was found in
the archive (nothing computed), else `miss`.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
from aiohttp import web

from node.api.routes import check_model, json_response, read_json
from node.api.fields import Fields
from node.api.schemas import is_token
from node.api.state import STATE, tenant_of
from node.serving.embeddings import EmbeddingInput
from node.serving.errors import Overloaded

ENCODINGS = ("float", "base64")


def parse_inputs(fields: Fields) -> list[EmbeddingInput]:
    value = fields.body.get("input")
    if value is None:
        raise fields.fail("input", "is required")
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        raise fields.fail("input", "must be a string, an array of strings, an array of token ids or an array "
                          "of arrays of token ids")
    if all(is_token(item) for item in value):
        return [tuple(value)]
    inputs: list[EmbeddingInput] = []
    for item in value:
        if isinstance(item, str):
            inputs.append(item)
        elif isinstance(item, list) and all(is_token(token) for token in item):
            inputs.append(tuple(item))
        else:
            raise fields.fail("input", "items must be strings or arrays of token ids (integers >= 0)")
    return inputs


def parse_embedding(body: Any) -> tuple[str | None, list[EmbeddingInput], str, int | None]:
    """(model, inputs, encoding_format, dimensions) of a request body."""
    fields = Fields(body)
    encoding = fields.string("encoding_format") or "float"
    if encoding not in ENCODINGS:
        raise fields.fail("encoding_format", f"must be one of {', '.join(ENCODINGS)}, got {encoding!r}")
    fields.string("user")  # accepted (a string) and ignored
    return fields.string("model"), parse_inputs(fields), encoding, fields.integer("dimensions", None)


def encode_row(row: np.ndarray, encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(np.ascontiguousarray(row, dtype="<f4").tobytes()).decode("ascii")
    return row.tolist()


async def embeddings(request: web.Request) -> web.Response:
    state = request.app[STATE]
    body, _ = await read_json(request)
    model, inputs, encoding, dimensions = parse_embedding(body)
    check_model(state, model)
    if not state.gate.try_enter():
        raise Overloaded(f"{state.gate.limit} requests are already in flight; retry shortly")
    try:
        vectors, usage = await state.service.embed(inputs, dimensions, tenant_of(request))
    finally:
        state.gate.leave()
    payload = {
        "object": "list",
        "data": [{"object": "embedding", "index": index, "embedding": encode_row(row, encoding)}
                 for index, row in enumerate(vectors)],
        "model": state.model.model_id,
        "usage": {"prompt_tokens": usage.prompt_tokens, "total_tokens": usage.total_tokens},
    }
    cache = "hit" if usage.cached_inputs == usage.inputs else "miss"
    return json_response(payload, headers={"X-Reame-Cache": cache})


def setup_embedding_routes(app: web.Application) -> None:
    app.router.add_post("/v1/embeddings", embeddings)
