"""L1: exact answers to deterministic requests, keyed by everything that shapes the output.

The key is `reame:l1:` + sha256 (hex) over a canonical header and the prompt's token ids:
the model's content fingerprint (never its path), the KV cache type (it changes the
numerics, so greedy output too), the endpoint kind, the chat template name, max_tokens,
stop strings, n, logprobs and every sampling parameter that can change a greedy choice
(penalties and logit_bias; top_k, top_p, min_p and the seed cannot, so they are left out
and requests differing only in them share one entry). `echo` and `stream` only change the
presentation and are applied when answering.

The value is a versioned JSON record of each choice as it streamed (text pieces with their
logprobs), its finish reason and its true token counts, so a hit answers exactly like the
generation did, streamed or not. A record that does not decode is a miss.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Sequence

import orjson

from node.api.schemas import GenerationOptions
from node.engine.types import TokenLogprob
from shared.tokens import pack_tokens

log = logging.getLogger(__name__)

KEY_PREFIX = b"reame:l1:"
KEY_VERSION = 1
RECORD_VERSION = 1


@dataclass(frozen=True, slots=True)
class Piece:
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class StoredChoice:
    pieces: tuple[Piece, ...]
    finish_reason: str
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class StoredAnswer:
    prompt_tokens: int
    choices: tuple[StoredChoice, ...]


def l1_key(
    *, fingerprint: str, kv_type: str, kind: str, template: str,
    prompt_tokens: Sequence[int], options: GenerationOptions,
) -> bytes:
    sampling = options.sampling
    header = {
        "v": KEY_VERSION, "model": fingerprint, "kv": kv_type, "kind": kind, "template": template,
        "max_tokens": options.max_tokens, "stop": list(options.stop), "n": options.n,
        "logprobs": options.logprobs, "temperature": sampling.temperature,
        "repeat_penalty": sampling.repeat_penalty, "repeat_last_n": sampling.repeat_last_n,
        "presence_penalty": sampling.presence_penalty, "frequency_penalty": sampling.frequency_penalty,
        "logit_bias": sorted(sampling.logit_bias.items()),
    }
    if not sampling.greedy:  # only a sampled answer depends on these
        header |= {"top_k": sampling.top_k, "top_p": sampling.top_p, "min_p": sampling.min_p, "seed": sampling.seed}
    digest = hashlib.sha256(orjson.dumps(header, option=orjson.OPT_SORT_KEYS))
    digest.update(b"\x00")
    digest.update(pack_tokens(prompt_tokens))
    return KEY_PREFIX + digest.hexdigest().encode()


def _logprob_to_json(item: TokenLogprob) -> list:
    return [item.token, item.text.hex(), item.logprob, [[t, b.hex(), lp] for t, b, lp in item.top]]


def _logprob_from_json(item: list) -> TokenLogprob:
    token, text, logprob, top = item
    return TokenLogprob(token=int(token), text=bytes.fromhex(text), logprob=float(logprob),
                        top=tuple((int(t), bytes.fromhex(b), float(lp)) for t, b, lp in top))


def encode_answer(answer: StoredAnswer) -> bytes:
    return orjson.dumps({
        "v": RECORD_VERSION,
        "prompt_tokens": answer.prompt_tokens,
        "choices": [
            {
                "finish_reason": choice.finish_reason,
                "completion_tokens": choice.completion_tokens,
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
                    pieces=tuple(Piece(str(text), tuple(_logprob_from_json(lp) for lp in lps))
                                 for text, lps in choice["pieces"]),
                )
                for choice in record["choices"]
            ),
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        log.warning("ignoring an L1 record that does not decode: %s", exc)
        return None
