"""Which errors of the layers below tietool mean that the network or the store failed, not the object.

Such a failure is :class:`~tietool.surgery.model.errors.StorageError` (exit 75): the same command run again
may succeed. :func:`surgery.io.store.remote_error` and :func:`~surgery.io.store.output_error` ask
:func:`is_transient`; every other third-party error stays a bad checkpoint (exit 3) or an output that
cannot be written (exit 6). The classes are tables, by module: only those a module already imported can
have raised.
"""

from __future__ import annotations

import errno
import sys

# network failures that a second run may not meet (:func:`is_transient`): builtin classes, then those of the
# libraries below the remote stores, by module (only those already imported can have raised)
_TRANSIENT_BUILTIN: tuple[type[BaseException], ...] = (
    ConnectionResetError,
    ConnectionRefusedError,
    ConnectionAbortedError,
    TimeoutError,
)
_TRANSIENT_ERRNO = frozenset(
    {errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED, errno.ETIMEDOUT, errno.EHOSTUNREACH}
    | {errno.ENETUNREACH, errno.ENETDOWN, errno.ENETRESET}
)
_TRANSIENT_THIRD_PARTY = (
    ("botocore.exceptions", ("ConnectionError", "ReadTimeoutError", "ConnectionClosedError")),
    ("aiohttp", ("ClientConnectionError", "ClientPayloadError", "ServerTimeoutError")),
    ("httpx", ("TimeoutException", "NetworkError", "RemoteProtocolError")),
    ("requests.exceptions", ("ConnectionError", "Timeout", "ChunkedEncodingError")),
    ("fsspec.exceptions", ("FSTimeoutError",)),
)
# S3 error codes of a store that is busy or failed for a moment (AWS "Error responses", retryable ones)
_TRANSIENT_S3_CODES = frozenset(
    {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "ServiceUnavailable", "InternalError"}
)


def _transient_one(e: BaseException) -> bool:
    if isinstance(e, _TRANSIENT_BUILTIN) or (isinstance(e, OSError) and e.errno in _TRANSIENT_ERRNO):
        return True
    for mod, names in _TRANSIENT_THIRD_PARTY:
        m = sys.modules.get(mod)
        classes = tuple(c for c in (getattr(m, n, None) for n in names) if isinstance(c, type))
        if m is not None and classes and isinstance(e, classes):
            return True
    try:  # a half-built error of a library may fail on any attribute read
        response = getattr(e, "response", None)
    except Exception:  # noqa: BLE001 - then it says nothing of a status
        return False
    if isinstance(response, dict):  # botocore's ClientError
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if response.get("Error", {}).get("Code") in _TRANSIENT_S3_CODES:
            return True
    else:  # requests' / httpx's HTTP status errors (huggingface_hub's HfHubHTTPError among them)
        try:
            status = getattr(response, "status_code", None)
        except Exception:  # noqa: BLE001 - httpx: a response without its request raises RuntimeError
            status = None
    return isinstance(status, int) and (status == 429 or 500 <= status <= 599)


def is_transient(e: BaseException) -> bool:
    """``e`` (or an error it was raised from: s3fs re-raises botocore's as ``OSError``) says that the
    network or the store failed, not the object: a refused, reset or aborted connection, a timeout, an
    unreachable network, an HTTP 429 or 5xx, an S3 ``SlowDown`` / ``InternalError``. Such a failure is
    :class:`StorageError` (exit 75): the same command run again may succeed."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen and len(seen) < 8:
        if _transient_one(cur):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False
