"""A Compute call's hidden rows and grad_input on the data plane (servers 0.18+ by default,
0.16+ started with --data-port; docs/API.md, "The data plane").

Messages cost gRPC and protobuf work per byte on one thread per connection at each end,
which holds one call to a fraction of what the host's TCP carries. On the data plane the
rows and grad_input travel as raw bytes on a TCP connection of their own, beside the
call's gRPC stream, which keeps the header, the token outputs, the summary and the status.
A client first checks once that it can reach the port at all (one it cannot leaves its
calls in messages); each call then connects when the server's PiecesOpened answer brings
its token (the server closes a connection that does not say which call it is for within
10 s, and a call may wait longer than that for staging memory), presents the token, sends
the rows in frames and its end frame, and receives grad_input frames straight into the
result tensor. Whatever breaks it fails the call, which lands nothing.
"""
from __future__ import annotations

import socket
import struct
import threading
from typing import Iterable, Optional, Tuple

from flce import tensors

MAGIC = b"FLCEDP1\n"
FRAME = struct.Struct("<qq")  # token offset, payload bytes (the end frame: -1, rows sent)
END_OFFSET = -1
CONNECT_TIMEOUT_S = 5.0


def tcp_host(target: str) -> Optional[str]:
    """The host of a gRPC target that names one TCP address ("host:port", "[v6]:port",
    "dns:///host:port", "ipv4:addr:port", "ipv6:[addr]:port"), else None (a Unix socket,
    another scheme, a list of addresses)."""
    for prefix in ("dns:///", "ipv4:", "ipv6:"):
        if target.startswith(prefix):
            target = target[len(prefix):]
            break
    else:
        if target.startswith(("unix:", "unix-abstract:", "vsock:")) or "://" in target:
            return None
    if "," in target or not target:
        return None
    if target.startswith("["):
        end = target.find("]")
        return target[1:end] if end > 1 else None
    return target.rsplit(":", 1)[0] if ":" in target else target


def probe(host: str, port: int) -> None:
    """Raises OSError where nothing accepts a connection at host:port."""
    socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    while len(view):
        got = sock.recv_into(view)
        if got == 0:
            raise ConnectionError("the server closed the data-plane connection")
        view = view[got:]


class DataPlaneCall:
    """One call's data-plane connection."""

    def __init__(self, host: str, port: int):
        self.address = (host, port)
        self._sock: Optional[socket.socket] = None
        self._threads = []
        self._closed = False
        self.send_failure: Optional[BaseException] = None
        self.receive_failure: Optional[BaseException] = None

    def start(self, token: bytes, chunks: Iterable[Tuple[int, memoryview]], rows: int,
              grad: Optional[tensors.RowAssembler]) -> None:
        """On the call's PiecesOpened: `chunks` (first row, bytes; taken on the sending
        thread) sent in order, then the end frame; grad_input, when asked for, received into
        `grad` until every row is in. Raises OSError where it cannot connect."""
        self._sock = socket.create_connection(self.address, timeout=CONNECT_TIMEOUT_S)
        self._sock.settimeout(None)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sender = threading.Thread(target=self._send, args=(token, chunks, rows),
                                  name="flce-data-send", daemon=True)
        sender.start()
        self._threads.append(sender)
        if grad is not None:
            receiver = threading.Thread(target=self._receive, args=(grad,),
                                        name="flce-data-receive", daemon=True)
            receiver.start()
            self._threads.append(receiver)

    def _send(self, token: bytes, chunks, rows: int) -> None:
        try:
            self._sock.sendall(MAGIC + token)
            for row, piece in chunks:
                self._sock.sendall(FRAME.pack(row, len(piece)))
                self._sock.sendall(piece)
            self._sock.sendall(FRAME.pack(END_OFFSET, rows))
            self._sock.shutdown(socket.SHUT_WR)
        except OSError as err:
            self.send_failure = err  # the call's status says why, when the server saw it
        except Exception as err:  # reading hidden (a GPU copy): the server sees a break
            self.send_failure = err
            self._shutdown()

    def _receive(self, grad: tensors.RowAssembler) -> None:
        header = bytearray(FRAME.size)
        try:
            while not grad.complete:
                _recv_into(self._sock, memoryview(header))
                row_bytes = grad.tensor.shape[1] * grad.tensor.element_size()
                offset, nbytes = FRAME.unpack(header)
                if row_bytes == 0 or offset < 0:
                    raise ValueError(f"a grad_input frame at token {offset}")
                _recv_into(self._sock, memoryview(grad.reserve(offset, nbytes)))
        except (OSError, ValueError) as err:
            self.receive_failure = err
            self._shutdown()

    def _shutdown(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def finish(self) -> None:
        """After the call's gRPC stream ended well: waits for every grad_input row."""
        for thread in self._threads:
            thread.join()

    def close(self) -> None:
        """Ends the connection (a call that failed: its threads stop), then waits for them."""
        if self._closed or self._sock is None:
            return
        self._closed = True
        self._shutdown()
        for thread in self._threads:
            thread.join()
        self._sock.close()
