"""The models package's typed errors: a model name that cannot become a usable GGUF file.

The catalog (node/models/catalog.py) raises them while resolving a name, the download
(node/models/download.py) while fetching one; the CLI prints their message as one line.
"""

from __future__ import annotations


class ModelError(Exception):
    """A model name that cannot be turned into a usable GGUF file; the message says why."""


class UnknownModel(ModelError):
    pass


class AmbiguousModel(ModelError):
    pass


class ModelUnavailable(ModelError):
    """The model is known but not on disk and cannot be fetched here."""
