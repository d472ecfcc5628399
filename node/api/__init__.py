"""The node's OpenAI-compatible HTTP API: app factory, routes, parsing, shapes, SSE, the error mapping."""

from node.api.app import create_app

__all__ = ["create_app"]
