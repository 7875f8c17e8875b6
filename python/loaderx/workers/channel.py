"""Framed messages, with file descriptors, over one end of a Unix socket pair.

A frame is a 16-byte header -- a magic, the payload's length and how many descriptors ride
with it -- followed by the pickled payload. The descriptors are sent with the header in one
``sendmsg`` (SCM_RIGHTS), so they arrive with the frame's first bytes and a receiver that
parses frames in order takes them in order.

The worker side blocks (:func:`send`, :func:`recv`); the consumer reads without blocking
through a :class:`Reader`, which keeps partial frames between calls so that it can wait on
several workers at once.
"""

from __future__ import annotations

import array
import os
import pickle
import socket
import struct
from typing import Any

from loaderx.errors import InternalError

__all__ = ["Closed", "Reader", "recv", "send"]

_HEADER = struct.Struct("<IIQ")  # magic, descriptor count, payload length
_MAGIC = 0x4C58574B              # "LXWK"
#: The most descriptors one frame may carry (a batch's new segments).
MAX_FDS = 16


class Closed(Exception):  # a signal between the two sides, never shown to users
    """The other end of the socket is closed."""


def send(sock: socket.socket, message: Any, fds: list[int] | tuple[int, ...] = ()) -> None:
    """Sends ``message`` (pickled) and ``fds`` as one frame (blocking)."""
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    header = _HEADER.pack(_MAGIC, len(fds), len(payload))
    if fds:
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
        sent = sock.sendmsg([header], ancillary)
        sock.sendall(header[sent:] + payload)
    else:
        sock.sendall(header + payload)


def _recv_exactly(sock: socket.socket, n: int, fds: list[int]) -> bytes:
    chunks = []
    while n:
        data, ancillary, _, _ = sock.recvmsg(n, socket.CMSG_SPACE(MAX_FDS * 4))
        _take_fds(ancillary, fds)
        if not data:
            raise Closed
        chunks.append(data)
        n -= len(data)
    return b"".join(chunks)


def recv(sock: socket.socket) -> tuple[Any, list[int]]:
    """The next frame's message and descriptors (blocking); :class:`Closed` at end of file."""
    fds: list[int] = []
    count, length = _header(_recv_exactly(sock, _HEADER.size, fds))
    payload = _recv_exactly(sock, length, fds)
    return pickle.loads(payload), fds


def _header(data: bytes | bytearray) -> tuple[int, int]:
    """A frame's descriptor count and payload length, from the bytes that start with it."""
    magic, count, length = _HEADER.unpack_from(data)
    if magic != _MAGIC or count > MAX_FDS:
        raise InternalError("a loaderx worker channel lost its framing")
    return count, length


def _take_fds(ancillary: list[tuple[int, int, bytes]], into: list[int]) -> None:
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds = array.array("i")
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
            into.extend(fds)


class Reader:
    """Non-blocking reads of frames from ``sock``: :meth:`poll` returns the frames that are
    complete, each as ``(message, fds)``."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock  # stays blocking for sends; reads here do not wait
        self.buf = bytearray()
        self.fds: list[int] = []
        self.chunk = bytearray(1 << 16)  # reused: a fresh buffer per read would cost more

    def poll(self) -> list[tuple[Any, list[int]]]:
        """Reads what is there; :class:`Closed` once the other end closed and every complete
        frame was returned."""
        eof = False
        chunk = self.chunk
        while True:
            try:
                n, ancillary, _, _ = self.sock.recvmsg_into(
                    [chunk], socket.CMSG_SPACE(MAX_FDS * 4), socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                eof = True
                break
            _take_fds(ancillary, self.fds)
            if not n:
                eof = True
                break
            self.buf += memoryview(chunk)[:n]
            if n < len(chunk):  # drained (most likely): no second call just to hear EAGAIN
                break
        frames = []
        while len(self.buf) >= _HEADER.size:
            count, length = _header(self.buf)
            end = _HEADER.size + length
            if len(self.buf) < end or len(self.fds) < count:
                break
            message = pickle.loads(memoryview(self.buf)[_HEADER.size:end])
            del self.buf[:end]
            fds, self.fds = self.fds[:count], self.fds[count:]
            frames.append((message, fds))
        if eof and not frames:
            raise Closed
        return frames

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        self.sock.close()
