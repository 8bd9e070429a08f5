"""Exceptions: one per gRPC status code the agent answers with, carrying its message."""
from __future__ import annotations

import grpc


class FerryError(Exception):
    """Base class. ``code`` is the gRPC status code, ``message`` the agent's explanation."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidArgument(FerryError, ValueError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(FerryError, LookupError):
    code = grpc.StatusCode.NOT_FOUND


class PermissionDenied(FerryError, PermissionError):
    code = grpc.StatusCode.PERMISSION_DENIED


class OutOfRange(FerryError, IndexError):
    code = grpc.StatusCode.OUT_OF_RANGE


class FailedPrecondition(FerryError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(FerryError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(FerryError, ConnectionError):
    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(FerryError, TimeoutError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Unauthenticated(FerryError):
    code = grpc.StatusCode.UNAUTHENTICATED


class Cancelled(FerryError):
    code = grpc.StatusCode.CANCELLED


class Internal(FerryError):
    code = grpc.StatusCode.INTERNAL


class AlreadyExists(FerryError):
    code = grpc.StatusCode.ALREADY_EXISTS


_BY_CODE = {cls.code: cls for cls in (InvalidArgument, NotFound, PermissionDenied, OutOfRange, FailedPrecondition,
                                      ResourceExhausted, Unavailable, DeadlineExceeded, Unauthenticated, Cancelled,
                                      Internal, AlreadyExists)}
_BY_NUMBER = {code.value[0]: cls for code, cls in _BY_CODE.items()}
_STATUS_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


def from_rpc_error(e: grpc.RpcError) -> FerryError:
    """The exception for a failed RPC."""
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    details = e.details() if hasattr(e, "details") else str(e)
    cls = _BY_CODE.get(code, FerryError)
    err = cls(details or str(code))
    if cls is FerryError:
        err.code = code
    return err


def from_code(code: int, message: str) -> FerryError:
    """The exception for a TransferResult's numeric code (google.rpc.Code)."""
    cls = _BY_NUMBER.get(code, FerryError)
    err = cls(message or f"transfer failed with status {code}")
    if cls is FerryError:
        err.code = _STATUS_BY_NUMBER.get(code, grpc.StatusCode.UNKNOWN)
    return err
