"""A Compute call's hidden rows over several connections (ComputePiece, server 0.13+).

One HTTP/2 connection is served by one thread at each end, which bounds what one call
moves in messages. With `Client(connections=N)` a call whose hidden goes in messages asks
the server for N - 1 pieces (`ComputeHeader.hidden_pieces`); the server answers the header
with a token (`PiecesOpened`), and each piece sends its share of the rows on a connection
of its own (gRPC channels with a local subchannel pool, so that they do not share one).
Row chunks of chunk_bytes / N are dealt round-robin over the call's own stream and the
pieces (a chunk's worth in flight on all of them together, so that the first rows arrive as
early as on one stream), each stream in token order, so the server takes the rows in order as they come. A piece that
fails fails the whole call, which lands nothing; grad_input comes back on the call's own
stream.
"""
from __future__ import annotations

import threading
from typing import Callable, List, Optional, Sequence, Tuple

import grpc

from flce import wire

# ComputePieceRequest.token: a piece's first message
_PIECE_TOKEN = 1


def encode_piece_token(token: bytes) -> bytes:
    """ComputePieceRequest{token}. (Its hidden chunks and end message are encoded as the
    Compute call's own: the fields have the same numbers.)"""
    return b"".join((wire.varint((_PIECE_TOKEN << 3) | 2), wire.varint(len(token)), token))


def deal(chunks: Sequence[Tuple[int, memoryview]], streams: int) -> List[list]:
    """The row chunks dealt round-robin over `streams` streams, each in token order."""
    return [list(chunks[k::streams]) for k in range(streams)]


class PieceSenders:
    """The pieces of one Compute call: started when its token arrives, each sending its
    share on its own stub, then its end message."""

    def __init__(self, stubs: Sequence[Callable], shares: Sequence[list], row_bytes: int,
                 timeout: Optional[float]):
        self._stubs = stubs
        self._shares = shares
        self._row_bytes = row_bytes
        self._timeout = timeout
        self._threads: List[threading.Thread] = []
        self._lock = threading.Lock()
        self._call = None  # the Compute call, while it runs
        # the piece failure that cancelled the call, if one came first
        self.failure: Optional[grpc.RpcError] = None

    def start(self, token: bytes) -> None:
        for stub, share in zip(self._stubs, self._shares):
            thread = threading.Thread(target=self._send, args=(stub, token, share),
                                      name="flce-piece", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _send(self, stub: Callable, token: bytes, share: list) -> None:
        rows = sum(len(piece) for _, piece in share) // self._row_bytes

        def messages():
            yield encode_piece_token(token)
            for row, piece in share:
                yield wire.encode_hidden_chunk(row, piece)
            yield wire.encode_end_of_input(rows)

        try:
            stub(messages(), timeout=self._timeout)
        except grpc.RpcError as err:
            # The server fails the call with a piece that broke once it has joined; one that
            # never reached it would keep the call waiting for it: the call is cancelled now.
            with self._lock:
                if self._call is not None and self.failure is None:
                    self.failure = err
                    self._call.cancel()

    def bind(self, call) -> None:
        """The running Compute call (a grpc call object with cancel())."""
        with self._lock:
            self._call = call

    def unbind(self) -> None:
        """The call has ended: nothing is cancelled from now on."""
        with self._lock:
            self._call = None

    def join(self) -> None:
        """Waits for every piece: the server answers each once the call has taken its
        rows, or has ended."""
        for thread in self._threads:
            thread.join()
