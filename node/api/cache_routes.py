"""Routes over the prefix KV cache: warm-ahead and chat sessions.

`POST /v1/warm` prefills `prompt` (a string, read as a completion prompt) or `messages`
(cut where later requests diverge, node/sessions/cuts.py) into the prefix cache and answers
with the tokens warmed, the tokens the cache already held, the tokens it holds now and the
time taken. Sessions: `POST /v1/sessions` creates one; chat requests carrying its id (the
`session` field or the `X-Reame-Session` header, handled in routes.py) continue it;
`GET /v1/sessions/{id}` shows it, `POST .../save` waits until its KV is on disk,
`POST .../load` brings its KV back into RAM (prefilling what no tier holds), `DELETE`
forgets it. Unknown ids are 404 `session_not_found` (mapped in errors.py); a client (its
key and address) past `[server] max_sessions_per_client` sessions gets 429 `too_many_sessions`.
"""

from __future__ import annotations

import hashlib

from aiohttp import web

from node.api.routes import check_model, json_response, make_plan, read_json
from node.api.fields import Fields
from node.api.schemas import parse_messages
from node.api.state import STATE, NodeState, tenant_of
from node.serving.errors import InvalidRequest
from node.sessions.cuts import CutError, shared_prefix
from node.sessions.turns import SessionTurns


def warm_tokens(state: NodeState, body: object) -> tuple[int, ...]:
    """The tokens `POST /v1/warm` prefills (blocking: renders and tokenizes)."""
    fields = Fields(body)
    has_prompt, has_messages = fields.present("prompt"), fields.present("messages")
    if has_prompt == has_messages:
        raise InvalidRequest("Send exactly one of 'prompt' (a string) or 'messages' (a chat)", param="prompt")
    service = state.service
    if has_prompt:
        prompt = fields.string("prompt")
        if not prompt:
            raise fields.fail("prompt", "must be a non-empty string")
        return service.prompts.completion(prompt)
    messages = [message.as_dict() for message in parse_messages(fields)]
    try:
        return service.prompts.rendered(shared_prefix(service.model.template, messages))
    except (ValueError, CutError) as exc:
        raise InvalidRequest(str(exc), param="messages", code="invalid_value") from None


async def warm(request: web.Request) -> web.Response:
    state = request.app[STATE]
    body, size = await read_json(request)
    check_model(state, Fields(body).string("model"))
    tokens = await make_plan(lambda payload: warm_tokens(state, payload), body, size)
    if len(tokens) >= state.model.n_ctx:
        raise InvalidRequest(f"{len(tokens)} tokens do not fit the context of {state.model.n_ctx}",
                             param="prompt", code="context_length_exceeded")
    result = await state.service.warm(tokens, tenant_of(request))
    return json_response({"object": "warm", "model": state.model.model_id, **result.as_dict()})


def _turns(request: web.Request) -> SessionTurns:
    turns = request.app[STATE].service.turns
    if turns is None:
        raise InvalidRequest("Sessions are not enabled on this node")
    return turns


def client_of(request: web.Request) -> str:
    """Who a request comes from, for per-client bounds: a digest of its key and address."""
    key = request.headers.get("Authorization", "")
    return hashlib.sha256(f"{key}\n{request.remote or ''}".encode("utf-8", "replace")).hexdigest()[:24]


async def create_session(request: web.Request) -> web.Response:
    turns = _turns(request)
    session = await turns.store.create(client_of(request))
    return json_response(turns.store.describe(session))


async def show_session(request: web.Request) -> web.Response:
    turns = _turns(request)
    session = await turns.store.get(request.match_info["session"])
    return json_response({**turns.store.describe(session), "history": list(session.messages)})


async def save_session(request: web.Request) -> web.Response:
    turns = _turns(request)
    session_id = request.match_info["session"]
    async with turns.store.lock(session_id):
        session = await turns.store.get(session_id)
        cached = await turns.save(session, tenant_of(request))
    return json_response({**turns.store.describe(session), "cached_tokens": cached})


async def load_session(request: web.Request) -> web.Response:
    turns = _turns(request)
    session_id = request.match_info["session"]
    async with turns.store.lock(session_id):
        session = await turns.store.get(session_id)
        result = await turns.load(session, tenant_of(request))
    warmed = result.as_dict() if result is not None else {"cached_tokens": 0, "stored_tokens": 0, "seconds": 0.0}
    return json_response({**turns.store.describe(session), **warmed, "tokens": len(session.tokens)})


async def delete_session(request: web.Request) -> web.Response:
    turns = _turns(request)
    session_id = request.match_info["session"]
    async with turns.store.lock(session_id):
        await turns.store.delete(session_id)
    return json_response({"id": session_id, "object": "session", "deleted": True})


def setup_cache_routes(app: web.Application) -> None:
    app.router.add_post("/v1/warm", warm)
    app.router.add_post("/v1/sessions", create_session)
    app.router.add_get("/v1/sessions/{session}", show_session)
    app.router.add_post("/v1/sessions/{session}/save", save_session)
    app.router.add_post("/v1/sessions/{session}/load", load_session)
    app.router.add_delete("/v1/sessions/{session}", delete_session)
