"""Constrained output: llama.cpp's GBNF grammar sampler, asked only about a few candidates.

llama.cpp's grammar sampler judges whichever tokens it is handed. Handing it the whole
262,144-token vocabulary every step would cost more than the decode, so the numpy sampler
asks about its best candidates first and widens the pool only when none of them fits
(see `TokenSampler`). One `Grammar` per sequence: it holds the parse state and advances
with every token the sequence accepts.
"""

from __future__ import annotations

import ctypes

import numpy as np

import llama_cpp as ll

from node.engine.errors import InvalidRequest

_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)


class Grammar:
    """The parse state of one sequence under one GBNF grammar."""

    __slots__ = ("_ptr",)

    def __init__(self, vocab: ll.llama_vocab_p, gbnf: str, root: str = "root") -> None:
        self._ptr = ll.llama_sampler_init_grammar(vocab, gbnf.encode("utf-8"), root.encode("utf-8"))
        if not self._ptr:
            raise InvalidRequest("the grammar does not parse as GBNF (llama.cpp grammar syntax)")

    def allowed(self, ids: np.ndarray) -> np.ndarray:
        """Boolean mask: which of these token ids may come next."""
        data = np.zeros(len(ids), dtype=_TOKEN_DATA)
        data["id"] = ids
        array = ll.llama_token_data_array(
            data=data.ctypes.data_as(ll.llama_token_data_p), size=len(ids), selected=-1, sorted=False)
        ll.llama_sampler_apply(self._ptr, ctypes.byref(array))
        return np.isfinite(data["logit"])

    def accept(self, token: int) -> None:
        ll.llama_sampler_accept(self._ptr, token)

    def close(self) -> None:
        if self._ptr:
            ll.llama_sampler_free(self._ptr)
            self._ptr = None

    def __del__(self) -> None:
        self.close()
