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

from node.api import ollama_schemas as ollama_limits
from node.api import fields as limits
from node.batches.lines import ENDPOINTS
from node.serving.embeddings import MAX_EMBEDDING_INPUTS  # a node's [embeddings] max_inputs may be lower

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
    "repeat_last_n": integer(-1, limits.MAX_TOKENS_LIMIT, "tokens the penalties look back at; 0 = off, -1 = all"),
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
    "format": {"anyOf": [{"enum": ["json", ""]}, JSON_SCHEMA],
               "description": "Ollama extension: \"json\" (any JSON object) or a JSON Schema; \"\" = none"},
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

EMBEDDING_REQUEST: Schema = {
    "type": "object", "required": ["input"],
    "properties": optional({
        "input": {"anyOf": [
            string("one text", minLength=1),
            {"type": "array", "minItems": 1, "maxItems": MAX_EMBEDDING_INPUTS,
             "items": {"type": "string", "minLength": 1}},
            TOKEN_IDS,
            {"type": "array", "minItems": 1, "maxItems": MAX_EMBEDDING_INPUTS, "items": TOKEN_IDS},
        ], "description": "texts or token ids; each input within [embeddings] batch_tokens tokens, all of them "
                          "within max_request_tokens, at most max_inputs of them"},
        "model": OPTIONS["model"],
        "encoding_format": {"enum": ["float", "base64"],
                            "description": "float arrays, or base64 of the little-endian float32 vector"},
        "dimensions": {"type": "integer", "minimum": 1,
                       "description": "keep the first N components and renormalise (N at most the model's width)"},
        "user": string("accepted and ignored"),
    }, required=("input",)),
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

TEXT_BLOCK: Schema = {"type": "object", "required": ["type", "text"],
                      "properties": {"type": {"enum": ["text"]}, "text": {"type": "string"}}}
TEXT_BLOCKS: Schema = {"anyOf": [{"type": "string"}, {"type": "array", "items": TEXT_BLOCK}]}
ANTHROPIC_BLOCK: Schema = {"anyOf": [
    TEXT_BLOCK,
    {"type": "object", "required": ["type", "id", "name", "input"], "description": "assistant: a tool call",
     "properties": {"type": {"enum": ["tool_use"]},
                    "id": string("the call's id", minLength=1, maxLength=limits.MAX_CALL_ID),
                    "name": string("the tool called", pattern=f"^{limits.TOOL_NAME.pattern}$"),
                    "input": {"type": "object", "description": "its arguments"}}},
    {"type": "object", "required": ["type", "tool_use_id"], "description": "user: a tool's result",
     "properties": {"type": {"enum": ["tool_result"]}, "tool_use_id": {"type": "string"},
                    "content": TEXT_BLOCKS, "is_error": boolean("accepted")}},
]}
ANTHROPIC_TOOL: Schema = {
    "type": "object", "required": ["name"],
    "properties": optional({
        "type": {"enum": ["custom"]},
        "name": string("the tool's name", pattern=f"^{limits.TOOL_NAME.pattern}$"),
        "description": string("what it does"),
        "input_schema": {**JSON_SCHEMA, "description": "its input's JSON Schema"},
    }, required=("name",)),
}
MESSAGES_FIELDS: dict[str, Schema] = {
    "model": OPTIONS["model"],
    "system": {**TEXT_BLOCKS, "description": "the system prompt: a string or text blocks"},
    "messages": {"type": "array", "minItems": 1, "maxItems": limits.MAX_MESSAGES, "items": {
        "type": "object", "required": ["role", "content"],
        "properties": {"role": {"enum": ["user", "assistant"]},
                       "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": ANTHROPIC_BLOCK}]}}}},
    "tools": {"type": "array", "maxItems": limits.MAX_TOOLS, "items": ANTHROPIC_TOOL,
              "description": "tools the model may call"},
    "tool_choice": {"type": "object", "required": ["type"], "properties": optional({
        "type": {"enum": ["auto", "any", "tool", "none"]},
        "name": string("with type tool: the tool to call"),
        "disable_parallel_tool_use": boolean("accepted; a forced call is one call")}),
        "description": "auto (templates that render tools), any (a call is required), tool (this one), none"},
    "output_config": {"type": "object", "properties": optional({
        "format": {"type": "object", "required": ["type"], "properties": optional({
            "type": {"enum": ["json_schema"]}, "schema": JSON_SCHEMA})},
        "effort": IGNORED}), "description": "structured output: format json_schema"},
}
MESSAGES_REQUEST: Schema = {
    "type": "object", "required": ["messages", "max_tokens"],
    "properties": optional({
        **MESSAGES_FIELDS,
        "max_tokens": integer(1, limits.MAX_TOKENS_LIMIT, "required: tokens to generate at most"),
        "stop_sequences": {"type": "array", "maxItems": limits.MAX_STOP_STRINGS,
                           "items": {"type": "string", "minLength": 1, "maxLength": limits.MAX_STOP_LENGTH},
                           "description": "generation ends before any of these (stop_reason stop_sequence)"},
        "temperature": SAMPLING["temperature"], "top_p": SAMPLING["top_p"], "top_k": SAMPLING["top_k"],
        "stream": boolean("answer as Anthropic's server-sent events"),
        "metadata": {"type": "object", "properties": optional({"user_id": {"type": "string"}}),
                     "description": "accepted; changes nothing"},
    }, required=("messages", "max_tokens")),
}
COUNT_TOKENS_REQUEST: Schema = {"type": "object", "required": ["messages"],
                                "properties": optional(MESSAGES_FIELDS, required=("messages",))}

RESPONSE_PART: Schema = {"type": "object", "required": ["type", "text"],
                         "properties": {"type": {"enum": ["input_text", "output_text"]}, "text": {"type": "string"}}}
RESPONSE_ITEM: Schema = {"anyOf": [
    {"type": "object", "required": ["role", "content"], "description": "a message",
     "properties": {"type": {"enum": ["message"]}, "role": {"enum": ["user", "system", "developer", "assistant"]},
                    "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": RESPONSE_PART}]}}},
    {"type": "object", "required": ["type", "call_id", "name"], "description": "a call the model made",
     "properties": {"type": {"enum": ["function_call"]},
                    "call_id": string("the call's id", minLength=1, maxLength=limits.MAX_CALL_ID),
                    "name": string("the function called", pattern=f"^{limits.TOOL_NAME.pattern}$"),
                    "arguments": string("its arguments: a JSON object as text")}},
    {"type": "object", "required": ["type", "call_id", "output"], "description": "a call's result",
     "properties": {"type": {"enum": ["function_call_output"]}, "call_id": {"type": "string"},
                    "output": {"anyOf": [{"type": "string"}, {"type": "array", "items": RESPONSE_PART}]}}},
]}
RESPONSES_REQUEST: Schema = {
    "type": "object", "required": ["input"],
    "properties": optional({
        "model": OPTIONS["model"],
        "input": {"anyOf": [{"type": "string"},
                            {"type": "array", "minItems": 1, "maxItems": limits.MAX_MESSAGES, "items": RESPONSE_ITEM}]},
        "instructions": string("a system message for this response only"),
        "max_output_tokens": integer(1, limits.MAX_TOKENS_LIMIT, "tokens to generate at most"),
        "temperature": SAMPLING["temperature"], "top_p": SAMPLING["top_p"],
        "stream": boolean("answer as server-sent events with OpenAI's event names"),
        "store": boolean("keep the response (default true): retrievable and continued by previous_response_id"),
        "previous_response_id": string("continue the conversation of a stored response"),
        "text": {"type": "object", "properties": optional({"format": {
            "type": "object", "required": ["type"], "properties": optional({
                "type": {"enum": ["text", "json_object", "json_schema"]},
                "name": string("the schema's name", pattern=f"^{limits.TOOL_NAME.pattern}$"),
                "schema": JSON_SCHEMA, "strict": boolean("accepted; the output always validates"),
                "description": string("what the schema is for")})}}),
            "description": "structured output: text.format"},
        "tools": {"type": "array", "maxItems": limits.MAX_TOOLS, "items": {
            "type": "object", "required": ["type", "name"], "properties": optional({
                "type": {"enum": ["function"]},
                "name": string("the function's name", pattern=f"^{limits.TOOL_NAME.pattern}$"),
                "description": string("what it does"),
                "parameters": {**JSON_SCHEMA, "description": "its arguments' JSON Schema"},
                "strict": boolean("accepted; arguments always validate")}, required=("type", "name"))}},
        "tool_choice": {"anyOf": [
            {"enum": ["none", "auto", "required"]},
            {"type": "object", "required": ["type", "name"],
             "properties": {"type": {"enum": ["function"]}, "name": {"type": "string"}}}],
            "description": "none, auto (templates that render tools), required, or one named function"},
        "parallel_tool_calls": boolean("accepted; a forced call is one call"),
        "metadata": {"type": "object", "maxProperties": 16, "additionalProperties": {"type": "string"}},
        "user": IGNORED, "truncation": IGNORED,
    }, required=("input",)),
}

ANTHROPIC_ERROR: Schema = {
    "type": "object", "required": ["type", "error"],
    "properties": {"type": {"enum": ["error"]}, "error": {
        "type": "object", "required": ["type", "message"],
        "properties": {"type": {"enum": ["invalid_request_error", "authentication_error", "permission_error",
                                         "not_found_error", "request_too_large", "rate_limit_error", "api_error",
                                         "overloaded_error"]},
                       "message": {"type": "string"}}}},
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
              media: tuple[str, ...] = ("application/json",), error: str = "Error") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for status in statuses:
        if status == 200:
            content = {kind: {"schema": success or {"type": "object"}} if kind == "application/json" else {}
                       for kind in media}
        else:
            content = {"application/json": {"schema": {"$ref": f"#/components/schemas/{error}"}}}
        out[str(status)] = {"description": STATUS_TEXT[status], "content": content}
    return out


def json_body(ref: str) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}}}


GENERATION_STATUSES = (200, 400, 401, 404, 413, 503)
GENERATION_MEDIA = ("application/json", "text/event-stream")
ANTHROPIC_PATHS = ("/v1/messages", "/v1/messages/count_tokens")
RESPONSE_PATH = [{"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}]
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
                 "description": f"OpenAI-compatible API of a reame node serving {model_id}, and Ollama's "
                                "API under /api/"},
        "components": {"schemas": {"CompletionRequest": COMPLETION_REQUEST, "ChatRequest": CHAT_REQUEST,
                                   "WarmRequest": WARM_REQUEST, "BatchRequest": BATCH_REQUEST,
                                   "EmbeddingRequest": EMBEDDING_REQUEST,
                                   "MessagesRequest": MESSAGES_REQUEST, "CountTokensRequest": COUNT_TOKENS_REQUEST,
                                   "ResponsesRequest": RESPONSES_REQUEST,
                                   "Error": ERROR, "AnthropicError": ANTHROPIC_ERROR, **OLLAMA_SCHEMAS}},
        "paths": described,
    }
    if auth:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"},
                                                "x-api-key": {"type": "apiKey", "in": "header", "name": "x-api-key"}}
        doc["security"] = [{"bearer": []}]
        for path in ANTHROPIC_PATHS:  # Anthropic's clients send the key as x-api-key
            for operation in described[path].values():
                operation["security"] = [{"bearer": []}, {"x-api-key": []}]
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
        "/v1/embeddings": {"post": {
            "summary": "Embeddings of texts or token ids (pooled by the model, L2-normalised, cached per input)",
            "requestBody": json_body("EmbeddingRequest"),
            "responses": responses(200, 400, 401, 404, 413, 503, success={
                "type": "object", "required": ["object", "data", "model", "usage"],
                "description": "OpenAI's embedding list: data[i] = {object, index, embedding}"})}},
        "/v1/messages": {"post": {
            "summary": "Anthropic Messages (errors in Anthropic's envelope)", "requestBody": json_body("MessagesRequest"),
            "responses": responses(*GENERATION_STATUSES, success={"type": "object", "description": "a message, or "
                                   "Anthropic's SSE events with stream: true"}, media=GENERATION_MEDIA,
                                   error="AnthropicError")}},
        "/v1/messages/count_tokens": {"post": {
            "summary": "The prompt's tokens as the model sees them", "requestBody": json_body("CountTokensRequest"),
            "responses": responses(200, 400, 401, 404, 413, error="AnthropicError")}},
        "/v1/responses": {"post": {
            "summary": "OpenAI Responses", "requestBody": json_body("ResponsesRequest"),
            "responses": responses(*GENERATION_STATUSES, success={"type": "object", "description": "a response, "
                                   "or its SSE events with stream: true"}, media=GENERATION_MEDIA)}},
        "/v1/responses/{response_id}": {
            "get": {"summary": "A stored response", "parameters": RESPONSE_PATH,
                    "responses": responses(200, 401, 404, 503)},
            "delete": {"summary": "Delete a stored response", "parameters": RESPONSE_PATH,
                       "responses": responses(200, 401, 404, 503)}},
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
        "/health": {"get": {"summary": "Liveness (no auth); with the key, the engine, cache and kernel state",
                            "security": [],
                            "responses": responses(200)}},
        "/metrics": {"get": {"summary": "Prometheus metrics",
                             "responses": responses(200, 401, 404, media=("text/plain",))}},
        "/openapi.json": {"get": {"summary": "This description", "responses": responses(200, 401)}},
        **ollama_paths(),
        "/": {"get": {"summary": "The chat page", "security": [],
                      "responses": responses(200, media=("text/html",))}},
    }


# Ollama's request bodies (node/api/ollama_schemas.py); its errors are `{"error": "..."}`.
OLLAMA_OPTIONS: Schema = {
    "type": "object", "additionalProperties": False,
    "properties": optional({
        **{key: SAMPLING[key] for key in ollama_limits.SAMPLING_OPTIONS},
        "stop": {"type": "array", "maxItems": limits.MAX_STOP_STRINGS,
                 "items": {"type": "string", "minLength": 1, "maxLength": limits.MAX_STOP_LENGTH}},
        "num_predict": {"anyOf": [integer(1, limits.MAX_TOKENS_LIMIT, "tokens to generate at most"),
                                  {"enum": list(ollama_limits.FILL_CONTEXT)}],
                        "description": "tokens to generate at most (512 when absent); -1, -2: until the "
                                       "context is full; always clipped to what the context leaves"},
        "num_ctx": integer(1, ollama_limits.MAX_CONTEXT_TOKENS, "the request's context window; at most "
                           "the node's (a 400 over it)"),
        **{key: {"enum": [value], "description": "accepted at its neutral value only"}
           for key, value in ollama_limits.NEUTRAL_OPTIONS.items()},
    }),
    "description": "Ollama's options; any other key (Ollama's load-time options too) is a 400 naming it",
}
OLLAMA_KEEP_ALIVE: Schema = {"anyOf": [{"type": "number"},
                                {"type": "string", "pattern": f"^(?:{ollama_limits.DURATION.pattern})$"}],
                      "description": "checked, without effect: the node keeps its model loaded while it runs"}
OLLAMA_COMMON: dict[str, Schema] = {
    "model": string("the served model's id (an Ollama ':latest' tag allowed); omitted = the served model"),
    "stream": boolean("NDJSON chunks (the default), or one object with false"),
    "options": OLLAMA_OPTIONS,
    "format": {"anyOf": [{"enum": ["json", ""]}, JSON_SCHEMA],
               "description": "\"json\" (any JSON object) or a JSON Schema the answer must match"},
    "keep_alive": OLLAMA_KEEP_ALIVE,
    "think": {"enum": [False, None], "description": "thinking is not supported: anything but false (or null, as absent) is a 400"},
    "logprobs": boolean("log-probabilities of each generated token"),
    "top_logprobs": integer(0, limits.MAX_TOP_LOGPROBS, "alternatives per token (with logprobs)"),
}
OLLAMA_NO_IMAGES: Schema = {"type": "array", "maxItems": 0, "description": "not supported: images are a 400"}
OLLAMA_MESSAGE: Schema = {"type": "object", "required": ["role"], "properties": optional({
    "role": {"enum": list(ollama_limits.ROLES)},
    "content": string("the message's text"),
    "images": OLLAMA_NO_IMAGES,
    "thinking": string("an earlier answer's thinking: not rendered"),
    "tool_calls": {"type": "array", "minItems": 1, "maxItems": limits.MAX_TOOL_CALLS, "items": {
        "type": "object", "required": ["function"], "properties": {"function": {
            "type": "object", "required": ["name"], "properties": optional({
                "name": string("the function called", pattern=f"^{limits.TOOL_NAME.pattern}$"),
                "arguments": {"type": "object", "description": "its arguments"},
            }, required=("name",))}}}},
    "tool_name": string("a tool result: the function whose first unanswered call it answers"),
}, required=("role",))}
OLLAMA_SCHEMAS: dict[str, Schema] = {
    "OllamaChatRequest": {"type": "object", "properties": optional({
        **OLLAMA_COMMON,
        "messages": {"type": "array", "maxItems": limits.MAX_MESSAGES, "items": OLLAMA_MESSAGE,
                     "description": "empty: the model is loaded already (done_reason load)"},
        "tools": {"type": "array", "maxItems": limits.MAX_TOOLS, "items": TOOL,
                  "description": "functions the model may call (needs a template that renders tools)"},
    })},
    "OllamaGenerateRequest": {"type": "object", "properties": optional({
        **OLLAMA_COMMON,
        "prompt": string("the prompt, rendered as one user turn unless raw; empty: load"),
        "system": string("a system turn before it"),
        "raw": boolean("the prompt as it is, without the chat template"),
        "context": {"type": "array", "maxItems": ollama_limits.MAX_CONTEXT_TOKENS,
                    "items": {"type": "integer", "minimum": 0},
                    "description": "an earlier answer's context: the tokens to continue from"},
        "images": OLLAMA_NO_IMAGES,
        "template": string("not supported: a non-empty value is a 400", maxLength=0),
        "suffix": string("not supported: a non-empty value is a 400", maxLength=0),
    })},
    "OllamaEmbedRequest": {"type": "object", "required": ["input"], "properties": optional({
        "model": OLLAMA_COMMON["model"], "options": OLLAMA_OPTIONS, "keep_alive": OLLAMA_KEEP_ALIVE,
        "input": {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {"type": "string"}}]},
        "truncate": boolean("accepted"), "dimensions": integer(1, limits.MAX_TOKENS_LIMIT, "accepted"),
    }, required=("input",))},
    "OllamaEmbeddingsRequest": {"type": "object", "required": ["prompt"], "properties": optional({
        "model": OLLAMA_COMMON["model"], "options": OLLAMA_OPTIONS, "keep_alive": OLLAMA_KEEP_ALIVE,
        "prompt": {"type": "string"},
    }, required=("prompt",))},
    "OllamaShowRequest": {"type": "object", "properties": optional({
        "model": OLLAMA_COMMON["model"], "name": string("the older name of `model`"),
        "verbose": boolean("accepted")})},
    "OllamaError": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
}


def ollama_paths() -> dict[str, Any]:
    """Ollama's routes (node/api/ollama_routes.py); every error in Ollama's envelope."""
    def answered(*statuses: int, media: tuple[str, ...] = ("application/json",)) -> dict[str, Any]:
        return responses(*statuses, media=media, error="OllamaError")

    ndjson = ("application/json", "application/x-ndjson")
    return {
        "/api/chat": {"post": {"summary": "Ollama chat", "requestBody": json_body("OllamaChatRequest"),
                               "responses": answered(*GENERATION_STATUSES, media=ndjson)}},
        "/api/generate": {"post": {"summary": "Ollama generate", "requestBody": json_body("OllamaGenerateRequest"),
                                   "responses": answered(*GENERATION_STATUSES, media=ndjson)}},
        "/api/tags": {"get": {"summary": "The served model, as Ollama lists models", "responses": answered(200, 401)}},
        "/api/ps": {"get": {"summary": "The served model, loaded while the node runs",
                            "responses": answered(200, 401)}},
        "/api/show": {"post": {"summary": "The served model's details, metadata and template",
                               "requestBody": json_body("OllamaShowRequest"),
                               "responses": answered(200, 400, 401, 404, 413)}},
        "/api/version": {"get": {"summary": "The node's version", "responses": answered(200, 401)}},
        "/api/embed": {"post": {"summary": "Ollama embeddings", "requestBody": json_body("OllamaEmbedRequest"),
                                "responses": answered(200, 400, 401, 404, 413, 503)}},
        "/api/embeddings": {"post": {"summary": "Ollama embeddings (the older route)",
                                     "requestBody": json_body("OllamaEmbeddingsRequest"),
                                     "responses": answered(200, 400, 401, 404, 413, 503)}},
    }
