"""`grammar.quote` on the real Gemma model: an extraction under a JSON Schema copies the
document's values, the source drafts their rest from the document's text, those drafts are
kept, and the answer is constrained decoding's without speculation, up to near-ties."""

from __future__ import annotations

import difflib
import json

import pytest

from node.engine.engine import Engine, EngineConfig
from node.engine.types import Finished, GenerationRequest, GrammarSpec, SamplingParams
from node.serving.structure import canonical_json
from node.speculative.controller import Controller, ControllerConfig
from node.speculative.costs import CostCurve
from node.speculative.format import Suggeritore
from node.speculative.lookup import PromptLookup
from tests.node.near_ties import assert_same_up_to_near_ties, reference_of

pytestmark = [pytest.mark.model]

DOCUMENT = ("Invoice 4471 from Dunmore Supplies Ltd, dated 3 March 2025, to Harlow Bakery, 12 Mill Lane, Ashby. "
            "Delivery charge 15.00. Total due 234.00, payable within 30 days to account 20-44-18 0039 1122. "
            "Contact: Maria Keane, accounts department, telephone 01632 960 118.")
# Values of three characters or more, asked for by name: with the prompt "The invoice as a JSON record"
# and plain strings, greedy decoding wrote every value empty under some hosts' kernels; without the worked
# example before it, an AMX-trapping Xeon's wrote every value as ": 01632 960 118, ", which opens no quote.
EXAMPLE = ("Document:\nInvoice 908 from Corran Timber, dated 9 May 2024, to Elm Street Joinery, 4 Quay Road, "
           "Fenwick. Contact: Owen Price, sales office, telephone 01632 960 441.\n\n"
           "The contact, supplier, customer and telephone as a JSON record:\n"
           '{"contact": "Owen Price", "supplier": "Corran Timber", "customer": "Elm Street Joinery", '
           '"telephone": "01632 960 441"}\n\n')
TEXT = {"type": "string", "minLength": 3}
SCHEMA = {"type": "object", "properties": {"contact": TEXT, "supplier": TEXT, "customer": TEXT, "telephone": TEXT},
          "required": ["contact", "supplier", "customer", "telephone"], "additionalProperties": False}


def test_an_extraction_copies_the_documents_values_as_drafts(gemma_path):
    lookup = PromptLookup()
    controller = Controller([lookup, *Suggeritore(lookup=lookup).sources()], ControllerConfig(max_draft=16))
    controller.costs = CostCurve({1: 0.0126, 8: 0.0150}, fixed=True)  # drafts judged alike on any host
    engine = Engine(EngineConfig(model_path=gemma_path, n_ctx=2048, n_parallel=2, max_draft=16, speculator=controller))
    controller.bind_vocabulary(engine.token_piece, lambda text: engine.tokenize(text, add_bos=False, special=False))
    try:
        spec = GrammarSpec("json_schema", canonical_json(SCHEMA))
        prompt = tuple(engine.tokenize(f"{EXAMPLE}Document:\n{DOCUMENT}\n\n"
                                       "The contact, supplier, customer and telephone as a JSON record:\n"))

        def answer(speculation: bool) -> tuple[Finished, list]:
            request = GenerationRequest(prompt, max_tokens=120, speculation=speculation, logprobs=2,
                                        sampling=SamplingParams(temperature=0.0, grammar=spec))
            events = list(engine.submit(request).iter_sync(timeout=300))
            assert events[-1].reason == "stop", events[-1]
            return reference_of(events)

        answer(False)  # the first prefills the whole prompt; the others continue from its resident slot
        plain = answer(False)
        drafted, _ = answer(True)
        assert_same_up_to_near_ties(plain, drafted)  # verify steps' rows may move a logit a little
        record = json.loads(engine.detokenize(drafted.generated).decode())
        # it copies: some value holds 7 characters or more of the document in a row (with the kernels of
        # some hosts, greedy decoding quotes a value with the punctuation around it, ": 01632 960 118, ")
        assert max(_quoted(value) for value in record.values()) >= 7, record
        kept = controller.stats["grammar.quote"].accepted
        assert kept > 0, controller.stats.snapshot()["grammar.quote"]
    finally:
        engine.close()


def _quoted(value: str) -> int:
    """The most characters in a row that the value shares with the document."""
    matcher = difflib.SequenceMatcher(None, value, DOCUMENT, autojunk=False)
    return matcher.find_longest_match(0, len(value), 0, len(DOCUMENT)).size
