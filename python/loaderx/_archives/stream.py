"""Reading an archive file's bytes, decompressed, with the compression's own integrity checks.

An archive is read to its very end: a gzip member ends with the CRC-32 and length of what it
holds, an xz stream with its check (CRC-64 by default), a bzip2 stream with its combined CRC;
the decompressors verify them only once they are given the stream's last bytes, so a reader
that stops at the tar's end-of-archive blocks never learns that the bytes it used were
damaged. :class:`ArchiveStream` decompresses in bounded steps (never more than it was asked
for, however well the data compresses), and :meth:`ArchiveStream.finish` reads the rest and
refuses a stream that does not end where its format says, or that has bytes after it (other
than further whole streams, which gzip, xz and bzip2 all allow, and xz's zero padding).

The kind is told from the first bytes, not from the file's name. Every failure of the data
is a :class:`~loaderx.errors.CorruptStoreError` naming the archive; failures of the system
(an unreadable file) stay the ``OSError`` they are.
"""

from __future__ import annotations

import bz2
import lzma
import os
import stat
import zlib
from typing import Any

from loaderx.errors import CorruptStoreError

__all__ = ["ArchiveStream"]

_READ = 256 << 10  # compressed bytes read from the file at a time
_STEP = 1 << 20  # most decompressed bytes produced by one call
_MAGIC = {b"\x1f\x8b": "gzip", b"\xfd7zXZ\x00": "xz", b"BZh": "bzip2"}
_ZSTD = b"\x28\xb5\x2f\xfd"


def _kind(head: bytes) -> str:
    for magic, kind in _MAGIC.items():
        if head.startswith(magic):
            return kind
    return "tar"


class ArchiveStream:
    """The decompressed bytes of the archive file ``path``, read front to back."""

    def __init__(self, path: str) -> None:
        self.path = path
        # Non-blocking: a FIFO at the path must not hang the open (it is refused below).
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise CorruptStoreError(f"{path} is not a regular file, so not an archive")
        self.file = os.fdopen(fd, "rb")  # closed by close()
        head = self.file.read(8)
        if head.startswith(_ZSTD):
            self.close()
            raise CorruptStoreError(f"{path} is zstd-compressed, which unpack does not read; "
                                    "decompress it first (zstd -d) or pack as .tar.gz/.tar.xz")
        self.kind = _kind(head)
        self.pending = head  # compressed bytes not yet given to the decompressor
        self.buffer = bytearray()  # decompressed bytes not yet read
        self.taken = 0  # decompressed bytes handed out so far
        self.file_done = False
        self.decoder: Any = self._new_decoder() if self.kind != "tar" else None
        self.tail = b""  # input zlib left unread (its unconsumed_tail), to give again

    def _new_decoder(self) -> Any:
        if self.kind == "gzip":
            return zlib.decompressobj(16 + zlib.MAX_WBITS)  # checks CRC-32 and ISIZE
        if self.kind == "xz":
            return lzma.LZMADecompressor(lzma.FORMAT_XZ)
        return bz2.BZ2Decompressor()

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> ArchiveStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _damaged(self, why: str) -> CorruptStoreError:
        return CorruptStoreError(f"{self.path} is damaged ({self.kind} data: {why}); it cannot "
                                 "be trusted -- take it again from its source")

    def _more_input(self) -> bytes:
        if self.pending:
            data, self.pending = self.pending, b""
            return data
        if self.file_done:
            return b""
        data = self.file.read(_READ)
        if not data:
            self.file_done = True
        return data

    def _fill(self, want: int) -> None:
        """Decompresses until ``buffer`` holds ``want`` bytes or the data ends."""
        while len(self.buffer) < want:
            if self.decoder is None:  # a plain tar
                data = self._more_input()
                if not data:
                    return
                self.buffer += data
                continue
            if self.decoder.eof:
                if not self._next_stream():
                    return
                continue
            if self.kind == "gzip":  # zlib hands back what max_length left unread
                data, self.tail = self.tail or self._more_input(), b""
                starved = not data
            elif self.decoder.needs_input:
                data = self._more_input()
                starved = not data
            else:  # output still inside the decompressor: ask for it, give nothing new
                data, starved = b"", False
            if starved:
                raise self._damaged("cut short: the compressed stream ends before its end")
            try:
                out = self.decoder.decompress(data, _STEP)
            except (zlib.error, lzma.LZMAError, EOFError) as e:
                raise self._damaged(str(e)) from None
            except OSError as e:
                if e.errno is not None:  # the system's failure, not the data's
                    raise
                raise self._damaged(str(e)) from None
            if self.kind == "gzip":
                self.tail = self.decoder.unconsumed_tail
            self.buffer += out

    def _next_stream(self) -> bool:
        """After a stream's end: starts the next one if one follows; False at the file's end.
        Anything else after a stream is refused."""
        rest = self.decoder.unused_data
        if self.kind == "xz":  # stream padding: zero bytes in multiples of four
            zeros = 0
            while True:
                stripped = rest.lstrip(b"\x00")
                zeros += len(rest) - len(stripped)
                rest = stripped or self._more_input()
                if stripped or not rest:
                    break
            if zeros % 4:
                raise self._damaged("stream padding that is not a multiple of four bytes")
        while len(rest) < 8:
            more = self._more_input()
            if not more:
                break
            rest += more
        if not rest:
            return False
        if _kind(rest) != self.kind:
            raise self._damaged(f"bytes after the end of the {self.kind} stream")
        self.decoder = self._new_decoder()
        self.pending = rest
        return True

    def read(self, n: int) -> bytes:
        """Exactly ``n`` bytes, or fewer only where the data ends."""
        self._fill(n)
        out = bytes(self.buffer[:n])
        del self.buffer[:n]
        self.taken += len(out)
        return out

    def finish(self, zeros_allowed: int) -> None:
        """Reads the rest: at most ``zeros_allowed`` more bytes, all zeros (a tar's padding
        after its end-of-archive blocks), then the end of the file, with every compressed
        stream complete and its check verified."""
        left = zeros_allowed
        while True:
            self._fill(min(left + 1, _STEP))
            if not self.buffer:
                break
            if self.buffer.count(0) != len(self.buffer):
                raise CorruptStoreError(f"{self.path} has data after the tar's end-of-archive "
                                        "blocks: damaged, or two archives in one file")
            if len(self.buffer) > left:
                raise CorruptStoreError(f"{self.path} has over {zeros_allowed} bytes of zeros "
                                        "after the tar's end-of-archive blocks")
            left -= len(self.buffer)
            self.taken += len(self.buffer)
            self.buffer.clear()
        # _fill returns short only at the end of the file, every stream ended and checked.
