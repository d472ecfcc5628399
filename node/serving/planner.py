"""From a validated request to its `Plan` (node/serving/plan.py), before anything runs.

`plan_completion` and `plan_chat` render each prompt (the chat template through
node/serving/prompts.py, a session turn's tokens through node/sessions/turns.py), check what
only the node knows (token ids inside the vocabulary, the Conclave's size against
`[conclave] max_candidates`, a session turn's single plain answer), and make one `Job` per
prompt: its tokens, its engine request and, for a deterministic request with L1 on, its L1
key (node/serving/l1.py; a Conclave's key also holds the node's explorer and adaptive-start
settings, which shape its verdict). A plan is made for one tenant (node/serving/tenants.py,
the API key the request came with): its L1 keys and its prefix states are that tenant's alone.

Deterministic means greedy (temperature 0). Sampled requests, seeded or not, always run
the model: a seeded sample is only as reproducible as the sampler implementation, and
clients setting a seed usually vary it on purpose.

Tool calls: a template that renders tools and marks calls gets the tools and the markers
(tool_choice "auto" reads them from the answer); for any other template a forced call is
told to the model in the system message.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from node.engine.types import INTERACTIVE, GenerationRequest
from node.serving.engine_client import EngineClient
from node.serving.errors import InvalidRequest, UnsupportedFeature
from node.serving.options import ServiceOptions
from node.serving.l1 import l1_key
from node.serving.model import ServedModel
from node.serving.plan import Job, Plan
from node.serving.prompts import Prompts
from node.serving.requests import ChatRequest, CompletionRequest, GenerationOptions
from node.serving.tools import ToolMarkers, new_call_id, tool_prompt, with_system
from node.serving.tenants import OPEN
from node.sessions.cuts import CutError
from node.sessions.store import Session
from node.sessions.turns import SessionTurns


class Planner:
    def __init__(self, engine: EngineClient, model: ServedModel, prompts: Prompts, options: ServiceOptions, *,
                 turns: SessionTurns | None = None, final_states: bool = False) -> None:
        self.engine = engine
        self.model = model
        self.prompts = prompts
        self.options = options
        self.turns = turns
        self.final_states = final_states  # a session turn's final state can be stored (the prefix cache is on)

    def plan_completion(self, req: CompletionRequest, *, priority: int = INTERACTIVE, tenant: str = OPEN) -> Plan:
        jobs = []
        for number, prompt in enumerate(req.prompts):
            if isinstance(prompt, str):
                tokens = self.prompts.completion(prompt)
                text = prompt
            else:
                bad = [token for token in prompt if token >= self.model.n_vocab]
                if bad:
                    raise InvalidRequest(f"'prompt' holds token ids outside the vocabulary of "
                                         f"{self.model.n_vocab}: {bad[:5]}", param="prompt", code="invalid_value")
                tokens = prompt
                text = self.engine.detokenize(prompt).decode("utf-8", "replace") if req.echo else ""
            jobs.append(self.job(number, "text", "none", tokens, text if req.echo else "", req.options, (),
                                 priority=priority, tenant=tenant))
        if req.options.conclave > 1 and len(jobs) > 1:
            raise InvalidRequest("A Conclave answers one prompt: send 'prompt' as one string or token array",
                                 param="prompt", code="invalid_value")
        return Plan("text", tuple(jobs), req.options)

    def plan_chat(self, req: ChatRequest, session: Session | None = None, *, priority: int = INTERACTIVE,
                  tenant: str = OPEN) -> Plan:
        template = self.model.template
        messages = [message.as_dict() for message in req.messages]
        output = req.options.output
        tools = None
        markers = None
        if output is not None and output.choice is not None:
            markers = ToolMarkers.of_template(template.source)
            if markers is not None:
                tools = [tool.as_dict() for tool in output.tools]
            elif output.choice == "auto":
                raise UnsupportedFeature(
                    f"Tool calls chosen by the model (tool_choice 'auto') are not supported by this model: its chat "
                    f"template ({template.name}) does not render tools or mark calls; use tool_choice 'required' "
                    f"or name a function", param=output.param)
            else:  # a forced call: tell the model what it is calling
                messages = with_system(messages, tool_prompt(output.tools, output.function))
        turn = None
        try:
            if session is None:
                tokens = self.prompts.chat(messages, tools=tools)
            else:
                if self.turns is None:
                    raise InvalidRequest("Sessions are not enabled on this node", param="session")
                if req.options.n != 1:
                    raise InvalidRequest("A session turn has one answer: 'n' must be 1", param="n")
                if req.options.conclave > 1 or req.options.best_of > 1:
                    field_name = "conclave" if req.options.conclave > 1 else "best_of"
                    raise InvalidRequest(f"A session turn has one plain answer: '{field_name}' is not "
                                         "available inside a session", param=field_name, code="invalid_value")
                turn = self.turns.begin(session, messages,
                                        new_call_id() if output is not None and output.forced_call else None)
                tokens = turn.prompt_tokens
        except (ValueError, CutError) as exc:  # TemplateError: roles the template cannot express, ...
            raise InvalidRequest(str(exc), param="messages", code="invalid_value") from None
        job = self.job(0, "chat", template.name, tuple(tokens), "", req.options, tuple(template.stop_strings),
                       store_final_state=turn is not None and self.final_states, priority=priority,
                       tenant=tenant)
        return Plan("chat", (job,), req.options, turn, markers)

    def job(self, number: int, kind: str, template: str, tokens: tuple[int, ...], echo: str,
            options: GenerationOptions, extra_stop: Sequence[str], *, store_final_state: bool = False,
            priority: int = INTERACTIVE, tenant: str = OPEN) -> Job:
        outside = [token for token in options.sampling.logit_bias if token >= self.model.n_vocab]
        if outside:
            raise InvalidRequest(f"'logit_bias' holds token ids outside the vocabulary of "
                                 f"{self.model.n_vocab}: {outside[:5]}", param="logit_bias", code="invalid_value")
        policy = self.options.conclave
        if options.conclave > policy.max_candidates:
            raise InvalidRequest(f"'conclave' must be between 1 and {policy.max_candidates} on this node "
                                 f"([conclave] max_candidates), got {options.conclave}",
                                 param="conclave", code="invalid_value")
        key = None
        if self.options.l1_enabled and options.deterministic:
            extra: Mapping[str, Any] | None = None
            if options.conclave > 1:  # the explorers' sampling and which candidates run are the node's settings
                extra = {"conclave.explore_temperature": policy.explore_temperature,
                         "conclave.seed": policy.seed, "conclave.adaptive": policy.adaptive,
                         "conclave.initial": policy.initial}
            key = l1_key(fingerprint=self.model.fingerprint, kv_type=self.model.kv_type, kind=kind,
                         template=template, prompt_tokens=tokens, options=options, extra=extra, tenant=tenant)
        request = GenerationRequest(
            prompt_tokens=tokens, max_tokens=options.max_tokens, sampling=options.sampling,
            stop=tuple(dict.fromkeys((*options.stop, *extra_stop))), logprobs=options.logprobs,
            store_final_state=store_final_state, speculation=options.speculation, priority=priority,
            max_wait_s=self.options.max_queue_wait_s if priority == INTERACTIVE else 0.0,  # batch lines wait
            cache_scope=tenant,
        )
        return Job(number * options.n, tokens, echo, request, options.n, key, options.conclave,
                   max(options.best_of, options.n))
