"""L1: exact answers to deterministic requests, keyed by everything that shapes the output.

The key is `reame:l1:` + sha256 (hex) over a canonical header and the prompt's token ids.
The header holds the model's content fingerprint (never its path), the KV cache type (it
changes the numerics, so greedy output too), the endpoint kind, the chat template name, and
every field of the request's `GenerationOptions` and `SamplingParams`, found by iterating
over the dataclasses' fields (the grammar too), except the ones listed in `NOT_KEYED`
(presentation only: `stream`, `include_usage`) and, for a greedy request that is neither
a Conclave nor a best_of (whose other candidates sample, seeded), `GREEDY_IRRELEVANT` (top_k, top_p, min_p and the seed cannot change a greedy choice, so
requests differing only in them share one entry). A field added later is therefore in the
key unless someone decides otherwise, and tests/node/serving/test_l1.py fails until it is
listed in `KEYED` or `NOT_KEYED`. The other
request fields are accounted for in `REQUEST_FIELDS`: the prompt or messages arrive as the
prompt's tokens, the model name as the fingerprint, and `echo` is presentation, applied when
answering.

The tenant (node/serving/tenants.py) is in the header too when it is not the open one, so one
tenant's answers are never another's hits (a node without keys keeps its keys as they were).

The value is a versioned JSON record of each choice as it streamed (text pieces with their
logprobs), its finish reason and its true token counts, so a hit answers exactly like the
generation did, streamed or not, and, for a Conclave, its verdict (the `reame` object). A
record that does not decode is a miss.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import orjson

from node.engine.types import SamplingParams, TokenLogprob
from node.serving.requests import ChatRequest, CompletionRequest, GenerationOptions
from shared.tokens import pack_tokens

log = logging.getLogger(__name__)

KEY_PREFIX = b"reame:l1:"
KEY_VERSION = 2  # 2: the header is derived from the request's fields (grammar included)
RECORD_VERSION = 1

# Every field of GenerationOptions, sampling parameters as "sampling.<name>", is in exactly one
# of these two lists (a test fails for a field in neither). The key does not read KEYED: it
# takes every field not in NOT_KEYED, so a field nobody classified is still in the key.
KEYED: frozenset[str] = frozenset({
    "max_tokens", "stop", "n", "logprobs", "conclave", "best_of", "output",
    "sampling.temperature", "sampling.top_k", "sampling.top_p", "sampling.min_p",
    "sampling.repeat_penalty", "sampling.repeat_last_n", "sampling.presence_penalty",
    "sampling.frequency_penalty", "sampling.logit_bias", "sampling.seed", "sampling.grammar",
})
# presentation only, or how the answer is computed but never what it is (speculation)
NOT_KEYED: frozenset[str] = frozenset({"stream", "include_usage", "speculation"})
# Keyed fields a greedy choice cannot depend on: in the key of sampled requests only.
GREEDY_IRRELEVANT: frozenset[str] = frozenset({"sampling.top_k", "sampling.top_p", "sampling.min_p",
                                                "sampling.seed"})
# Where each field of the endpoint requests goes: into the key through another input, or nowhere.
REQUEST_FIELDS: Mapping[type, Mapping[str, str]] = {
    CompletionRequest: {"model": "fingerprint", "prompts": "prompt_tokens", "echo": "presentation",
                        "options": "options"},
    ChatRequest: {"model": "fingerprint", "messages": "prompt_tokens", "options": "options"},
}


@dataclass(frozen=True, slots=True)
class Piece:
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class StoredChoice:
    pieces: tuple[Piece, ...]
    finish_reason: str
    completion_tokens: int
    stop_sequence: str | None = None  # the stop string that ended it


@dataclass(frozen=True, slots=True)
class StoredAnswer:
    prompt_tokens: int
    choices: tuple[StoredChoice, ...]
    consensus: Mapping[str, Any] | None = None  # a Conclave's verdict, answered again with a hit


def l1_key(
    *, fingerprint: str, kv_type: str, kind: str, template: str,
    prompt_tokens: Sequence[int], options: GenerationOptions, extra: Mapping[str, Any] | None = None,
    tenant: str = "",
) -> bytes:
    """`extra`: node settings that shape the answer beyond the request (a Conclave's explorers);
    `tenant`: whose answer it is ("" : the open tenant's)."""
    header: dict[str, Any] = {"v": KEY_VERSION, "model": fingerprint, "kv": kv_type, "kind": kind,
                              "template": template, "options": keyed_fields(options)}
    if tenant:
        header["tenant"] = tenant
    if extra:
        header["extra"] = {name: _canonical(value) for name, value in extra.items()}
    digest = hashlib.sha256(orjson.dumps(header, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS))
    digest.update(b"\x00")
    digest.update(pack_tokens(prompt_tokens))
    return KEY_PREFIX + digest.hexdigest().encode()


def keyed_fields(options: GenerationOptions) -> dict[str, Any]:
    """Every output-affecting field of the options, sampling parameters as "sampling.<name>"."""
    # a Conclave's explorers and best_of's candidates sample, seeded: then the seed counts
    greedy = options.sampling.greedy and options.conclave <= 1 and options.best_of <= 1
    values: dict[str, Any] = {}
    for name, value in _fields(options):
        if name in NOT_KEYED or (greedy and name in GREEDY_IRRELEVANT):
            continue
        values[name] = _canonical(value)
    return values


def _fields(options: GenerationOptions) -> list[tuple[str, Any]]:
    sampling: SamplingParams = options.sampling
    return [
        *((f.name, getattr(options, f.name)) for f in dataclasses.fields(options) if f.name != "sampling"),
        *((f"sampling.{f.name}", getattr(sampling, f.name)) for f in dataclasses.fields(sampling)),
    ]


def _canonical(value: Any) -> Any:
    """A JSON value that is equal exactly when the field's values are (mappings sorted)."""
    if isinstance(value, Mapping):
        return sorted((_canonical(k), _canonical(v)) for k, v in value.items())
    if isinstance(value, (tuple, list)):
        return [_canonical(item) for item in value]
    return value


def _logprob_to_json(item: TokenLogprob) -> list[Any]:
    return [item.token, item.text.hex(), item.logprob, [[t, b.hex(), lp] for t, b, lp in item.top]]


def _logprob_from_json(item: list[Any]) -> TokenLogprob:
    token, text, logprob, top = item
    return TokenLogprob(token=int(token), text=bytes.fromhex(text), logprob=float(logprob),
                        top=tuple((int(t), bytes.fromhex(b), float(lp)) for t, b, lp in top))


def encode_answer(answer: StoredAnswer) -> bytes:
    return orjson.dumps({
        "v": RECORD_VERSION,
        "prompt_tokens": answer.prompt_tokens,
        **({"reame": answer.consensus} if answer.consensus is not None else {}),
        "choices": [
            {
                "finish_reason": choice.finish_reason,
                "completion_tokens": choice.completion_tokens,
                **({"stop_sequence": choice.stop_sequence} if choice.stop_sequence is not None else {}),
                "pieces": [[p.text, [_logprob_to_json(lp) for lp in p.logprobs]] for p in choice.pieces],
            }
            for choice in answer.choices
        ],
    })


def decode_answer(value: bytes) -> StoredAnswer | None:
    try:
        record = orjson.loads(value)
        if record.get("v") != RECORD_VERSION:
            return None
        return StoredAnswer(
            prompt_tokens=int(record["prompt_tokens"]),
            choices=tuple(
                StoredChoice(
                    finish_reason=str(choice["finish_reason"]),
                    completion_tokens=int(choice["completion_tokens"]),
                    stop_sequence=str(choice["stop_sequence"]) if choice.get("stop_sequence") is not None else None,
                    pieces=tuple(Piece(str(text), tuple(_logprob_from_json(lp) for lp in lps))
                                 for text, lps in choice["pieces"]),
                )
                for choice in record["choices"]
            ),
            consensus=dict(record["reame"]) if record.get("reame") is not None else None,
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        log.warning("ignoring an L1 record that does not decode: %s", exc)
        return None
