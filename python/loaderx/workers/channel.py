"""Framed messages, with file descriptors, over one end of a Unix socket pair.

A frame is a 16-byte header -- a magic, the payload's length and how many descriptors ride
with it -- followed by the pickled payload. The descriptors are sent with the header in one
``sendmsg`` (SCM_RIGHTS), so they arrive with the frame's first bytes and a receiver that
parses frames in order takes them in order.

The worker side blocks (:func:`send`, :class:`Inbox`); the consumer reads without blocking
through a :class:`Reader`, which keeps partial frames between calls so that it can wait on
several workers at once, and which loses nothing to an interrupt (see there).
"""

from __future__ import annotations

import array
import functools
import itertools
import os
import pickle
import socket
import struct
from typing import Any

from loaderx.errors import InternalError

__all__ = ["Closed", "Inbox", "Reader", "frame_bytes", "send"]

_HEADER = struct.Struct("<IIQ")  # magic, descriptor count, payload length
_MAGIC = 0x4C58574B              # "LXWK"
#: The most descriptors one frame may carry (a batch's new segments).
MAX_FDS = 16


class Closed(Exception):  # a signal between the two sides, never shown to users
    """The other end of the socket is closed."""


def frame_bytes(message: Any) -> bytes:
    """``message`` as one frame with no descriptors, ready for ``sendall``."""
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(_MAGIC, 0, len(payload)) + payload


def send(sock: socket.socket, message: Any, fds: list[int] | tuple[int, ...] = (),
         before: bytes = b"") -> None:
    """Sends ``message`` (pickled) and ``fds`` as one frame (blocking), after the frames of
    ``before`` (from :func:`frame_bytes`) in the same call. The descriptors ride with the
    first bytes; a reader that takes each frame's count in order gives them to this one."""
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    header = before + _HEADER.pack(_MAGIC, len(fds), len(payload))
    if fds:
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
        sent = sock.sendmsg([header], ancillary)
        sock.sendall(header[sent:] + payload)
    else:
        sock.sendall(header + payload)


class Inbox:
    """The worker's blocking reads: one ``recvmsg`` takes in whatever has arrived -- often
    several steps' messages at once -- and :meth:`recv` hands them out one by one."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.fds: list[int] = []
        self.chunk = bytearray(1 << 16)

    def recv(self) -> tuple[Any, list[int]]:
        """The next frame's message and descriptors (blocking); :class:`Closed` at end of
        file."""
        while (complete := _frame_end(self.buf, len(self.fds))) is None:
            self._read(0)
        count, end = complete
        message = pickle.loads(memoryview(self.buf)[_HEADER.size:end])
        del self.buf[:end]
        fds, self.fds = self.fds[:count], self.fds[count:]
        return message, fds

    def waiting(self) -> bool:
        """Whether a frame is there to be received without waiting (one read that does not
        wait, if none is in the buffer yet)."""
        if _frame_end(self.buf, len(self.fds)) is None:
            try:
                self._read(socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return False
        return _frame_end(self.buf, len(self.fds)) is not None

    def _read(self, flags: int) -> None:
        n, ancillary, _, _ = self.sock.recvmsg_into([self.chunk], socket.CMSG_SPACE(MAX_FDS * 4),
                                                    flags)
        _take_fds(ancillary, self.fds)
        if not n:
            raise Closed
        self.buf += memoryview(self.chunk)[:n]


def _header(data: bytes | bytearray) -> tuple[int, int]:
    """A frame's descriptor count and payload length, from the bytes that start with it."""
    magic, count, length = _HEADER.unpack_from(data)
    if magic != _MAGIC or count > MAX_FDS:
        raise InternalError("a loaderx worker channel lost its framing")
    return count, length


def _frame_end(buf: bytearray, fds: int) -> tuple[int, int] | None:
    """``(descriptors, end)`` of the frame at the start of ``buf`` when all of it (bytes and
    descriptors, of which ``fds`` have arrived) is there, else None."""
    if len(buf) < _HEADER.size:
        return None
    count, length = _header(buf)
    end = _HEADER.size + length
    return (count, end) if len(buf) >= end and fds >= count else None


def _take_fds(ancillary: list[tuple[int, int, bytes]], into: list[int]) -> None:
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds = array.array("i")
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
            into.extend(fds)


class Reader:
    """Frames from ``sock`` as they arrive, read by the consumer between its own steps.

    The consumer reads on its own thread, where a signal handler (Ctrl-C) may raise at any call
    or backward jump, so nothing read may sit only in a local variable: :meth:`fill` stores what
    ``recvmsg`` returns inside one C call (``list.extend`` over an iterator made of C callables
    only -- ``islice`` of ``iter(recvmsg, None)`` -- which runs no Python code), and a frame
    is consumed by two statements that call nothing (see :meth:`frame`). A frame interrupted
    half way through its handling is simply handled again.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock  # stays blocking for sends; reads here do not wait
        self.received: list[tuple[bytes, Any, int, Any]] = []  # as recvmsg returned them
        self.buf = bytearray()
        self.fds: list[int] = []
        # Descriptors of handled frames, owned here until closed: a frame's handler moves them
        # in its commit, so that they are closed once, whether by it or by close().
        self.closing: list[int] = []
        self.closed = False
        # An endless iterator of reads (one that raises stays usable).
        self._reads = iter(functools.partial(sock.recvmsg, 1 << 16,
                                             socket.CMSG_SPACE(MAX_FDS * 4),
                                             socket.MSG_DONTWAIT), None)

    def fill(self) -> None:
        """Reads what the socket holds now, without waiting."""
        try:
            # One read (a reply is far smaller than its 64 KiB; the next wait reports the rest).
            self.received.extend(itertools.islice(self._reads, 1))
        except OSError:  # drained (or the worker gone: its sentinel reports that)
            pass
        self.settle()

    def backlog(self) -> bool:
        """Whether a frame was read but not handled (an interrupt came in between): the socket
        no longer reports it, so the consumer must look here before it waits."""
        return bool(self.received) or _frame_end(self.buf, len(self.fds)) is not None

    def settle(self) -> None:
        """Moves what was read into the buffer of frames."""
        while self.received:
            data, ancillary, _, _ = self.received[0]
            fds: list[int] = []
            _take_fds(ancillary, fds)
            # Moved to the buffer with no call in between (a signal handler cannot run there).
            self.buf += data
            self.fds += fds
            del self.received[0]

    def frame(self) -> tuple[Any, list[int], int] | None:
        """The first complete frame as ``(message, fds, end)``, still in the buffer: the caller
        consumes it with ``del reader.buf[:end]; del reader.fds[:len(fds)]`` in its own
        frame, right after recording what it did with the frame (a method call would be a
        place for an interrupt to land between the two)."""
        complete = _frame_end(self.buf, len(self.fds))
        if complete is None:
            return None
        count, end = complete
        return pickle.loads(self.buf[_HEADER.size:end]), self.fds[:count], end

    def close_handled(self) -> None:
        """Closes the descriptors of the frames handled (each popped before it is closed: an
        interrupt may leak one, never close one twice)."""
        while self.closing:
            os.close(self.closing.pop())

    def close(self) -> None:
        self.closed = True
        self.close_handled()
        while self.fds:
            os.close(self.fds.pop())
        for _, ancillary, _, _ in self.received:
            fds: list[int] = []
            _take_fds(ancillary, fds)
            for fd in fds:
                os.close(fd)
        self.received = []
        self.sock.close()
