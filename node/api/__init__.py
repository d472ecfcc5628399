"""The node's OpenAI-compatible HTTP API: app factory, routes, schemas, SSE, errors, metrics."""

from node.api.app import create_app

__all__ = ["create_app"]
