"""The archive client's one error, raised only where a miss would be the wrong answer."""

from __future__ import annotations


class ArchiveUnavailable(ConnectionError):
    """The archive could not be asked (down, refusing us, or its breaker open).

    Only the session operations raise it: a missing cached answer is a miss, but a session
    that cannot be read is not the same as a session that does not exist."""
