"""The Batch API's own failures (serving errors, mapped to HTTP in node/api/errors.py)."""

from __future__ import annotations

from node.serving.errors import InvalidRequest, ServingError


class FileTooLarge(InvalidRequest):
    """An upload over `[batch] max_file_mb` (413)."""

    default_code = "file_too_large"


class StorageFull(ServingError):
    """An upload would take the stored files past `[batch] max_storage_mb` (507)."""

    default_code = "storage_full"


class BatchConflict(InvalidRequest):
    """The batch's status does not allow what was asked (cancel a finished batch, ...)."""

    default_code = "invalid_batch_status"


class TooManyFiles(ServingError):
    """One client keeps `[batch] max_files_per_client` uploads already (429)."""

    default_code = "too_many_files"
