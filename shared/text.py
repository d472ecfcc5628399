"""Text shown to people (error bodies, log lines): clipped identifiers and redacted URLs.

`clip(value)` shortens what a client sent before it is echoed (a 20,000-character id in a
404 body is 64 characters and a count); `redact_url(url)` hides the password of a
`redis://user:password@host` address before it is logged.
"""

from __future__ import annotations

import re

CLIP_CHARS = 64
_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^:@/\s]*:)(?P<secret>[^@/\s]+)(?P<at>@)", re.IGNORECASE)


def clip(value: str, limit: int = CLIP_CHARS) -> str:
    """`value` as it may be echoed: at most `limit` characters, then how many more there were."""
    if len(value) <= limit:
        return value
    return f"{value[:limit]}... ({len(value) - limit} more characters)"


def redact_url(text: str) -> str:
    """`text` with the password of every `scheme://user:password@` address replaced by `***`."""
    return _PASSWORD.sub(lambda m: f"{m['head']}***{m['at']}", text)
