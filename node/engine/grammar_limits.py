"""What the grammar engine (llguidance) may spend on one grammar, wherever it compiles one.

llguidance's defaults let one grammar's lexer build up to 250,000 states (1-2 kB each) and
put the whole parser state and grammar in its error messages (one was 330 KB, echoed to the
client and logged). Every compile of the node (the request check in node/serving/structure.py
and the engine's compile in node/engine/grammar.py) passes `parser_limits()`: short errors and
at most `MAX_LEXER_STATES` lexer states (about 50-100 MB) per grammar.
"""

from __future__ import annotations

from typing import Any

MAX_LEXER_STATES = 50_000
MAX_GRAMMAR_SIZE = 200_000  # symbols in the grammar's productions (llguidance's default: 500,000)


def parser_limits() -> Any:
    import llguidance

    return llguidance.LLParserLimits(max_lexer_states=MAX_LEXER_STATES, max_grammar_size=MAX_GRAMMAR_SIZE,
                                     verbose_errors=False)


def short_error(message: object, limit: int = 300) -> str:
    """A grammar engine's message on one line, cut to `limit` characters."""
    text = " ".join(line.strip() for line in str(message).splitlines() if line.strip())
    return text if len(text) <= limit else text[:limit] + "…"
