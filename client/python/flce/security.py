"""TLS credentials and the bearer token of a flce.Client.

The token travels as `authorization: Bearer <token>` metadata on every call, added by a
client interceptor so that it works on plaintext channels too (gRPC's call credentials
need TLS). Without TLS it crosses the network in clear text.
"""

import os
from typing import Optional, Sequence, Tuple

import grpc


def _read(path: Optional[str]) -> Optional[bytes]:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


def channel_credentials(tls_ca: Optional[str], tls_cert: Optional[str],
                        tls_key: Optional[str]) -> grpc.ChannelCredentials:
    """TLS credentials: the server checked against tls_ca (PEM file; None = the system's
    roots), tls_cert + tls_key (PEM files) presented for mutual TLS."""
    if bool(tls_cert) != bool(tls_key):
        raise ValueError("tls_cert and tls_key go together: give both or neither")
    return grpc.ssl_channel_credentials(root_certificates=_read(tls_ca),
                                        private_key=_read(tls_key),
                                        certificate_chain=_read(tls_cert))


def resolve_token(auth_token: Optional[str], auth_token_file: Optional[str]) -> Optional[str]:
    """The token from the argument, else the first line of the file, else $FLCE_AUTH_TOKEN."""
    if auth_token and auth_token_file:
        raise ValueError("give auth_token or auth_token_file, not both")
    if auth_token:
        return auth_token
    if auth_token_file:
        with open(auth_token_file, encoding="utf-8") as f:
            return f.readline().strip()
    return os.environ.get("FLCE_AUTH_TOKEN") or None


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, details, metadata: Sequence[Tuple[str, str]]):
        self.method = details.method
        self.timeout = details.timeout
        self.metadata = metadata
        self.credentials = details.credentials
        self.wait_for_ready = getattr(details, "wait_for_ready", None)
        self.compression = getattr(details, "compression", None)


class BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                  grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds `authorization: Bearer <token>` to every call."""

    def __init__(self, token: str):
        self._header = ("authorization", f"Bearer {token}")

    def _details(self, details):
        metadata = list(details.metadata or []) + [self._header]
        return _CallDetails(details, metadata)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)
