"""One exception type for every failed call, carrying gRPC's status code."""
from __future__ import annotations

import functools
from typing import Optional

import grpc


# The server's prefix for refusals of results that are not finite.
NON_FINITE_RESULT = "non-finite result: "


class FlceError(RuntimeError):
    """A flce call failed. `code` is the grpc.StatusCode (UNAVAILABLE when the server is
    gone, INVALID_ARGUMENT naming the bad field, ...); `method` the RPC's name;
    `request_id` the idempotency key the failed call carried, when it had one (retry
    with it: a repeat is never applied twice)."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str,
                 request_id: Optional[str] = None):
        self.method = method
        self.code = code
        self.details = details
        self.request_id = request_id
        super().__init__(f"flce {method} failed: {code.name}: {details}")

    @property
    def non_finite(self) -> bool:
        """The call was refused because a result (loss, grad_input or grad_W) was NaN or
        Inf: nothing landed on the server. Under mixed precision this is an overflow that
        a GradScaler handles by skipping the step."""
        return (self.code == grpc.StatusCode.INVALID_ARGUMENT
                and self.details.startswith(NON_FINITE_RESULT))


def from_rpc_error(method: str, err: grpc.RpcError) -> FlceError:
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    return FlceError(method, code or grpc.StatusCode.UNKNOWN, details or "")


def translate(method: str):
    """Decorator: grpc.RpcError raised inside becomes FlceError(method, ...)."""

    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except grpc.RpcError as err:
                raise from_rpc_error(method, err) from err

        return inner

    return wrap
