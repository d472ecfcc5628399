"""Batch lines answered exactly like the live endpoints: the same parser, the same service.

`ApiLines` is the Batch API's `LineExecutor` (node/batches/lines.py). `check` parses a line's
body with the endpoint's own parser (node/api/schemas.py) and checks its model, so a line is
refused before the batch starts for exactly what the endpoint would refuse. `run` waits
for its turn while live requests are answered (node/serving/live_first.py: the line's parsing,
planning, L1 replay and shaping run on the event loop, outside the engine's classes), plans it
at batch priority (node/engine/types.py: interactive requests are admitted first), for the
tenant whose key created the batch (its L1 answers and prefix states, node/serving/tenants.py), and
collects the answer through the service, so L1, the prefix cache and speculation apply as
they do to live requests; a failure becomes the status and OpenAI error body the endpoint
would have answered (node/api/errors.py), and an overloaded engine asks to be retried.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import orjson

from node.api.errors import error_reply
from node.api.routes import check_model, collect, make_plan
from node.api.schemas import parse_chat, parse_completion
from node.api.shapes import Identity
from node.api.state import NodeState
from node.batches.lines import LineResult
from node.engine.types import BATCH
from node.serving.errors import InvalidRequest, Overloaded
from node.serving.plan import Plan
from node.serving.requests import ChatRequest, CompletionRequest
from node.serving.tenants import OPEN

log = logging.getLogger(__name__)


class ApiLines:
    def __init__(self, state: NodeState) -> None:
        self.state = state

    def parse(self, url: str, body: Any) -> ChatRequest | CompletionRequest:
        if url == "/v1/chat/completions":
            req: ChatRequest | CompletionRequest = parse_chat(body)
        elif url == "/v1/completions":
            req = parse_completion(body)
        else:
            raise InvalidRequest(f"Batch lines may call /v1/chat/completions or /v1/completions, not {url}",
                                 param="url")
        if req.options.stream:
            raise InvalidRequest("'stream' cannot be true in a batch line", param="stream")
        check_model(self.state, req.model)
        return req

    def check(self, url: str, body: Any) -> None:
        """Blocking (the store's thread): the parse, then the schema checks on a grammar thread."""
        self.state.service.verify_blocking(self.parse(url, body).options)

    def plan(self, req: ChatRequest | CompletionRequest, tenant: str = OPEN) -> Plan:
        service = self.state.service
        if isinstance(req, ChatRequest):
            return service.plan_chat(req, priority=BATCH, tenant=tenant)
        return service.plan_completion(req, priority=BATCH, tenant=tenant)

    async def run(self, url: str, body: bytes, tenant: str = OPEN) -> LineResult:
        state = self.state
        await state.service.live_first.batch_turn()  # live requests first: see node/serving/live_first.py
        try:
            req = self.parse(url, orjson.loads(body))
            plan = await make_plan(partial(self.plan, tenant=tenant), req, len(body))
            identity = Identity.new(plan.kind, state.model.model_id, state.model.system_fingerprint)
            async with state.service.answer(plan) as result:
                return LineResult(200, await collect(plan, result, identity))
        except Exception as exc:
            reply = error_reply(exc, unexpected="The batch line failed")
            if reply.unexpected:
                log.exception("batch line failed")
            return LineResult(reply.status, reply.body(), retry=isinstance(exc, Overloaded))
