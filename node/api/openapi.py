"""The node's API described as OpenAPI 3.1, served at `GET /openapi.json`.

Every route, every request field with its JSON type and range, every status a route can
answer. Ranges and limits come from the constants the parser enforces (node.api.schemas),
so the description cannot drift from the validation; tests/node/api/test_openapi_fuzz.py
sends generated bodies (valid ones, and ones with a single field broken) to a live node and
holds it to this description. Schemas use only plain JSON Schema keywords (type, ranges,
enum, items, properties) so ordinary tools and generators read them.
"""

from __future__ import annotations

from typing import Any

from node.api import schemas as limits
from node.batches.lines import ENDPOINTS

Schema = dict[str, Any]
UINT64_MAX = 2**64 - 1


def integer(lo: int, hi: int, doc: str) -> Schema:
    return {"type": "integer", "minimum": lo, "maximum": hi, "description": doc}


def number(lo: float, hi: float, doc: str, *, above_lo: bool = False) -> Schema:
    low = {"exclusiveMinimum": lo} if above_lo else {"minimum": lo}
    return {"type": "number", **low, "maximum": hi, "description": doc}


def boolean(doc: str) -> Schema:
    return {"type": "boolean", "description": doc}


def string(doc: str, **extra: Any) -> Schema:
    return {"type": "string", "description": doc, **extra}


def optional(properties: dict[str, Schema], required: tuple[str, ...] = ()) -> dict[str, Schema]:
    """Properties outside `required` also take null, which the parser reads as omitted."""
    return {name: schema if name in required or "type" not in schema and "anyOf" not in schema
            else {"anyOf": [schema, {"type": "null"}], **({"description": schema["description"]}
                                                           if "description" in schema else {})}
            for name, schema in properties.items()}


IGNORED: Schema = {"description": "accepted and ignored"}

TOKEN_IDS: Schema = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0},
                     "description": "token ids of the served model's vocabulary"}

SAMPLING: dict[str, Schema] = {
    "temperature": number(0.0, 2.0, "0 = greedy (and cacheable in the archive)"),
    "top_k": integer(0, 1_000_000, "0 = off"),
    "top_p": number(0.0, 1.0, "nucleus sampling", above_lo=True),
    "min_p": number(0.0, 1.0, "drop tokens under min_p times the best one's probability"),
    "repeat_penalty": number(limits.MIN_REPEAT_PENALTY, 10.0, "llama.cpp's repeat penalty; 1 = off"),
    "presence_penalty": number(-2.0, 2.0, "OpenAI's presence penalty"),
    "frequency_penalty": number(-2.0, 2.0, "OpenAI's frequency penalty"),
    "logit_bias": {
        "type": "object", "maxProperties": limits.MAX_LOGIT_BIAS,
        "propertyNames": {"pattern": "^[0-9]+$"},
        "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
        "description": "token id (in the vocabulary) -> bias added to its logit",
    },
    "seed": integer(-1, UINT64_MAX, "sampling seed; -1 = a fresh random one"),
}

OPTIONS: dict[str, Schema] = {
    "model": string("the served model's id, alias or GGUF file name; omitted = the served model"),
    "max_tokens": integer(1, limits.MAX_TOKENS_LIMIT, "tokens to generate at most"),
    "max_completion_tokens": integer(1, limits.MAX_TOKENS_LIMIT, "same as max_tokens (wins over it)"),
    **SAMPLING,
    "stop": {"anyOf": [
        string("one stop string", minLength=1, maxLength=limits.MAX_STOP_LENGTH),
        {"type": "array", "maxItems": limits.MAX_STOP_STRINGS,
         "items": {"type": "string", "minLength": 1, "maxLength": limits.MAX_STOP_LENGTH}},
    ], "description": "generation ends before any of these strings; the stop text is never sent"},
    "n": integer(1, limits.MAX_CHOICES, "choices, forked from one prefill"),
    "best_of": integer(1, limits.MAX_CHOICES, "candidates generated; the n with the highest mean token "
                       "logprob are returned (at least n)"),
    "conclave": integer(1, limits.MAX_CONCLAVE, "extension: candidates of a best-of-N consensus; one voted "
                        "answer, its verdict in the response's `reame` object (needs n = 1, no best_of > 1)"),
    "stream": boolean("answer as server-sent events"),
    "stream_options": {"type": "object", "properties": optional({"include_usage": boolean("a last chunk with usage")}),
                       "description": "only with stream: true"},
    "speculation": boolean("extension: false decodes this request without draft tokens (the output is the same)"),
    "user": IGNORED,
}

JSON_SCHEMA: Schema = {"type": "object", "description": "a JSON Schema the output must validate against"}
STRUCTURE: dict[str, Schema] = {
    "response_format": {
        "type": "object", "required": ["type"],
        "properties": {
            "type": {"enum": ["text", "json_object", "json_schema"]},
            "json_schema": {"type": "object", "required": ["schema"], "properties": optional({
                "name": string("the schema's name", pattern=f"^{limits.TOOL_NAME.pattern}$"),
                "description": string("what the schema is for"),
                "schema": JSON_SCHEMA,
                "strict": boolean("accepted; the output always validates"),
            }, required=("schema",))},
        },
        "description": "OpenAI structured output: any JSON object, or JSON valid under a schema",
    },
    "grammar": string("llama.cpp extension: a GBNF grammar the output must match", minLength=1),
    "json_schema": {**JSON_SCHEMA, "description": "llama.cpp extension: a JSON Schema the output must match"},
    "format": {"anyOf": [{"enum": ["json"]}, JSON_SCHEMA],
               "description": "Ollama extension: \"json\" (any JSON object) or a JSON Schema"},
}
TOOL: Schema = {
    "type": "object", "required": ["type", "function"],
    "properties": {
        "type": {"enum": ["function"]},
        "function": {"type": "object", "required": ["name"], "properties": optional({
            "name": string("the function's name", pattern=f"^{limits.TOOL_NAME.pattern}$"),
            "description": string("what it does"),
            "parameters": {**JSON_SCHEMA, "description": "its arguments' JSON Schema"},
            "strict": boolean("accepted; arguments always validate"),
        }, required=("name",))},
    },
}
TOOLS: dict[str, Schema] = {
    "tools": {"type": "array", "maxItems": limits.MAX_TOOLS, "items": TOOL,
              "description": "functions the model may call"},
    "tool_choice": {"anyOf": [
        {"enum": ["none", "auto", "required"]},
        {"type": "object", "required": ["type", "function"],
         "properties": {"type": {"enum": ["function"]},
                        "function": {"type": "object", "required": ["name"],
                                     "properties": {"name": {"type": "string"}}}}},
    ], "description": "none, auto (templates that render tools), required, or one named function"},
    "parallel_tool_calls": boolean("accepted; a forced call is one call"),
}

COMPLETION_REQUEST: Schema = {
    "type": "object", "required": ["prompt"],
    "properties": optional({
        "prompt": {"anyOf": [
            string("one prompt"),
            {"type": "array", "minItems": 1, "maxItems": limits.MAX_PROMPTS, "items": {"type": "string"}},
            TOKEN_IDS,
            {"type": "array", "minItems": 1, "maxItems": limits.MAX_PROMPTS, "items": TOKEN_IDS},
        ]},
        "echo": boolean("prefix each answer with its prompt"),
        "logprobs": integer(0, limits.MAX_TOP_LOGPROBS, "logprob of each token plus this many alternatives"),
        **OPTIONS,
        **STRUCTURE,
    }, required=("prompt",)),
}

CONTENT_PART: Schema = {"type": "object", "required": ["type", "text"],
                        "properties": {"type": {"enum": ["text"]}, "text": {"type": "string"}}}

CONTENT: Schema = {"anyOf": [{"type": "string"}, {"type": "array", "items": CONTENT_PART}]}
TOOL_CALL: Schema = {
    "type": "object", "required": ["id", "type", "function"],
    "properties": {
        "id": string("the call's id, answered by a tool message's tool_call_id", minLength=1,
                     maxLength=limits.MAX_CALL_ID),
        "type": {"enum": ["function"]},
        "function": {"type": "object", "required": ["name", "arguments"], "properties": {
            "name": string("the function called", pattern=f"^{limits.TOOL_NAME.pattern}$"),
            "arguments": string("its arguments: a JSON object as text"),
        }},
    },
}
MESSAGE: Schema = {"anyOf": [
    {"type": "object", "required": ["role", "content"], "properties": {
        "role": {"enum": [role for role in limits.CHAT_ROLES if role != "tool"]},
        "content": CONTENT,
        "name": IGNORED,
    }},
    {"type": "object", "required": ["role", "tool_calls"], "description": "an assistant's tool calls sent back",
     "properties": {
         "role": {"enum": ["assistant"]},
         "content": {"anyOf": [CONTENT, {"type": "null"}]},
         "tool_calls": {"type": "array", "minItems": 1, "maxItems": limits.MAX_TOOL_CALLS, "items": TOOL_CALL},
     }},
    {"type": "object", "required": ["role", "tool_call_id", "content"],
     "description": "a tool's result, answering a call of an earlier assistant message",
     "properties": {
         "role": {"enum": ["tool"]},
         "tool_call_id": {"type": "string"},
         "content": CONTENT,
     }},
]}

CHAT_REQUEST: Schema = {
    "type": "object", "required": ["messages"],
    "properties": optional({
        "messages": {"type": "array", "minItems": 1, "maxItems": limits.MAX_MESSAGES, "items": MESSAGE},
        "logprobs": boolean("logprob of each generated token"),
        "top_logprobs": integer(0, limits.MAX_TOP_LOGPROBS, "alternatives per token; needs logprobs: true"),
        "session": string("continue a session made by POST /v1/sessions (or the X-Reame-Session header)"),
        **OPTIONS,
        **STRUCTURE,
        **TOOLS,
    }, required=("messages",)),
}

WARM_REQUEST: Schema = {
    "type": "object",
    "properties": optional({
        "model": OPTIONS["model"],
        "prompt": string("a completion prompt to prefill", minLength=1),
        "messages": CHAT_REQUEST["properties"]["messages"],
    }),
    "description": "exactly one of prompt and messages",
}

BATCH_REQUEST: Schema = {
    "type": "object", "required": ["input_file_id", "endpoint"],
    "properties": optional({
        "input_file_id": string("a file uploaded with purpose batch"),
        "endpoint": {"enum": list(ENDPOINTS), "description": "the url of every line"},
        "completion_window": {"enum": ["24h"]},
        "metadata": {"type": "object", "maxProperties": 16, "additionalProperties": {"type": "string"}},
    }, required=("input_file_id", "endpoint")),
}

FILE_UPLOAD: Schema = {
    "type": "object", "required": ["purpose", "file"],
    "properties": {"purpose": {"enum": ["batch"]},
                   "file": {"type": "string", "format": "binary",
                            "description": "JSON Lines: custom_id, method, url, body per line"}},
}

ERROR: Schema = {
    "type": "object", "required": ["error"],
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "code", "param"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "code": {"type": ["string", "null"]}, "param": {"type": ["string", "null"]}},
    }},
}

STATUS_TEXT = {
    200: "success", 400: "invalid request: the field is named in error.param", 401: "missing or wrong API key",
    404: "unknown path, model or session", 405: "wrong method", 413: "body over the size limit",
    429: "this client's bound of sessions or files is reached",
    500: "a bug in the node (never expected)", 503: "overloaded or shutting down; see Retry-After",
    507: "the stored files' byte budget is spent ([batch] max_storage_mb)",
}


def responses(*statuses: int, success: Schema | None = None,
              media: tuple[str, ...] = ("application/json",)) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for status in statuses:
        if status == 200:
            content = {kind: {"schema": success or {"type": "object"}} if kind == "application/json" else {}
                       for kind in media}
        else:
            content = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
        out[str(status)] = {"description": STATUS_TEXT[status], "content": content}
    return out


def json_body(ref: str) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}}}


GENERATION_STATUSES = (200, 400, 401, 404, 413, 503)
GENERATION_MEDIA = ("application/json", "text/event-stream")
SESSION_PATH = [{"name": "session", "in": "path", "required": True, "schema": {"type": "string"}}]
FILE_PATH = [{"name": "file_id", "in": "path", "required": True, "schema": {"type": "string"}}]
BATCH_PATH = [{"name": "batch_id", "in": "path", "required": True, "schema": {"type": "string"}}]


def document(model_id: str, version: str, *, auth: bool) -> dict[str, Any]:
    """The OpenAPI 3.1 document of a node serving `model_id`; with `auth` (an API key is set)
    every route but /health and the page needs the bearer key and may answer 401."""
    described = paths()
    if not auth:
        for operations in described.values():
            for operation in operations.values():
                operation["responses"].pop("401", None)
                operation.pop("security", None)
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "reame node", "version": version,
                 "description": f"OpenAI-compatible API of a reame node serving {model_id}"},
        "components": {"schemas": {"CompletionRequest": COMPLETION_REQUEST, "ChatRequest": CHAT_REQUEST,
                                   "WarmRequest": WARM_REQUEST, "BatchRequest": BATCH_REQUEST,
                                   "Error": ERROR}},
        "paths": described,
    }
    if auth:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
    return doc


def paths() -> dict[str, Any]:
    """Every route with its operations (a fresh copy each call)."""
    completion_ok = {"type": "object", "description": "an OpenAI completion, or SSE chunks with stream: true"}
    return {
        "/v1/completions": {"post": {
            "summary": "Text completion", "requestBody": json_body("CompletionRequest"),
            "responses": responses(*GENERATION_STATUSES, success=completion_ok, media=GENERATION_MEDIA)}},
        "/v1/chat/completions": {"post": {
            "summary": "Chat completion", "requestBody": json_body("ChatRequest"),
            "responses": responses(*GENERATION_STATUSES, success=completion_ok, media=GENERATION_MEDIA)}},
        "/v1/models": {"get": {"summary": "The served model", "responses": responses(200, 401)}},
        "/v1/models/{model}": {"get": {
            "summary": "One model card", "responses": responses(200, 401, 404),
            "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}]}},
        "/v1/warm": {"post": {
            "summary": "Prefill a prompt or chat into the prefix cache before anyone asks",
            "requestBody": json_body("WarmRequest"), "responses": responses(200, 400, 401, 404, 413, 503)}},
        "/v1/sessions": {"post": {"summary": "Create a chat session", "responses": responses(200, 400, 401, 429)}},
        "/v1/sessions/{session}": {
            "get": {"summary": "A session and its history", "parameters": SESSION_PATH,
                    "responses": responses(200, 400, 401, 404)},
            "delete": {"summary": "Forget a session", "parameters": SESSION_PATH,
                       "responses": responses(200, 400, 401, 404)}},
        "/v1/sessions/{session}/save": {"post": {
            "summary": "Wait until the session's KV is on disk", "parameters": SESSION_PATH,
            "responses": responses(200, 400, 401, 404, 503)}},
        "/v1/sessions/{session}/load": {"post": {
            "summary": "Bring the session's KV back into RAM", "parameters": SESSION_PATH,
            "responses": responses(200, 400, 401, 404, 503)}},
        "/v1/files": {
            "post": {"summary": "Upload a batch input file (multipart: purpose, file)",
                     "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": FILE_UPLOAD}}},
                     "responses": responses(200, 400, 401, 413, 429, 507)},
            "get": {"summary": "Stored files, newest first", "parameters": [
                {"name": "purpose", "in": "query", "schema": {"type": "string"}},
                {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 10_000}},
                {"name": "after", "in": "query", "schema": {"type": "string"}}],
                    "responses": responses(200, 400, 401, 404)}},
        "/v1/files/{file_id}": {
            "get": {"summary": "A file object", "parameters": FILE_PATH, "responses": responses(200, 401, 404)},
            "delete": {"summary": "Delete a file", "parameters": FILE_PATH, "responses": responses(200, 401, 404)}},
        "/v1/files/{file_id}/content": {"get": {
            "summary": "A file's bytes", "parameters": FILE_PATH,
            "responses": responses(200, 401, 404, media=("application/octet-stream",))}},
        "/v1/batches": {
            "post": {"summary": "Start a batch over an uploaded file", "requestBody": json_body("BatchRequest"),
                     "responses": responses(200, 400, 401, 404, 413)},
            "get": {"summary": "Batches, newest first", "parameters": [
                {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 10_000}},
                {"name": "after", "in": "query", "schema": {"type": "string"}}],
                    "responses": responses(200, 400, 401, 404)}},
        "/v1/batches/{batch_id}": {"get": {"summary": "A batch object", "parameters": BATCH_PATH,
                                           "responses": responses(200, 401, 404)}},
        "/v1/batches/{batch_id}/cancel": {"post": {
            "summary": "Cancel a batch (finished lines are kept)", "parameters": BATCH_PATH,
            "responses": responses(200, 400, 401, 404)}},
        "/v1/reame/stats": {"get": {"summary": "Tokens served against tokens computed, by tier, and the trend",
                                    "responses": responses(200, 401)}},
        "/health": {"get": {"summary": "Liveness, engine and cache state (no auth)", "security": [],
                            "responses": responses(200)}},
        "/metrics": {"get": {"summary": "Prometheus metrics",
                             "responses": responses(200, 401, 404, media=("text/plain",))}},
        "/openapi.json": {"get": {"summary": "This description", "responses": responses(200, 401)}},
        "/": {"get": {"summary": "The chat page", "security": [],
                      "responses": responses(200, media=("text/html",))}},
    }
