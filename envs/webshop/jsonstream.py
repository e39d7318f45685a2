"""Streaming reader for one big JSON array or object (WebShop's product file is one 1.18M-item array).

:func:`iter_json_records` yields the top-level items one at a time together with their byte offset and
byte length in the file, so a caller can keep only the offsets and re-read one record later with
:func:`read_record` (``os.pread``), without ever holding the whole file in memory.
"""
from __future__ import annotations

import codecs
import json
import os
import re
from typing import Any, Iterator, Optional, Tuple

_WS = re.compile(r"[ \t\n\r]*")
CHUNK_BYTES = 1 << 22
MAX_RECORD_CHARS = 1 << 28  # a single record larger than this is treated as a corrupt file


class _Reader:
    def __init__(self, f, path: str, chunk_bytes: int):
        self.f = f
        self.path = path
        self.chunk = chunk_bytes
        self.udec = codecs.getincrementaldecoder("utf-8")()
        self.buf = ""
        self.pos = 0
        self.byte_pos = 0  # byte offset in the file of buf[pos]
        self.eof = False
        self.ascii = True  # the buffer holds only ASCII: byte lengths equal character lengths
        self.dec = json.JSONDecoder()

    def fill(self) -> None:
        data = self.f.read(self.chunk)
        if not data:
            self.eof = True
            tail = self.udec.decode(b"", final=True)
            if tail:
                self.buf = self.buf[self.pos:] + tail
                self.pos = 0
                self.ascii = self.buf.isascii()
            return
        self.buf = self.buf[self.pos:] + self.udec.decode(data)
        self.pos = 0
        self.ascii = self.buf.isascii()

    def skip_ws(self) -> None:
        if self.pos < len(self.buf) and self.buf[self.pos] not in " \t\n\r":
            return
        while True:
            end = _WS.match(self.buf, self.pos).end()
            self.byte_pos += end - self.pos  # whitespace is ASCII
            self.pos = end
            if self.pos < len(self.buf) or self.eof:
                return
            self.fill()

    def peek(self) -> str:
        self.skip_ws()
        if self.pos >= len(self.buf):
            raise ValueError(f"{self.path}: unexpected end of file at byte {self.byte_pos}")
        return self.buf[self.pos]

    def expect(self, chars: str) -> str:
        c = self.peek()
        if c not in chars:
            raise ValueError(f"{self.path}: expected one of {chars!r} at byte {self.byte_pos}, found {c!r}")
        self.pos += 1
        self.byte_pos += 1
        return c

    def value(self) -> Tuple[Any, int, int]:
        self.skip_ws()
        while True:
            try:
                obj, end = self.dec.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as e:
                if self.eof:
                    raise ValueError(f"{self.path}: invalid JSON near byte {self.byte_pos}: {e.msg}") from None
                if len(self.buf) - self.pos > MAX_RECORD_CHARS:
                    raise ValueError(f"{self.path}: record at byte {self.byte_pos} is not valid JSON "
                                     f"(or larger than {MAX_RECORD_CHARS} characters)") from None
                self.fill()
                continue
            if end >= len(self.buf) and not self.eof:  # a number may continue in the next chunk
                self.fill()
                continue
            start = self.byte_pos
            nbytes = end - self.pos if self.ascii else len(self.buf[self.pos:end].encode("utf-8"))
            self.byte_pos += nbytes
            self.pos = end
            return obj, start, nbytes


def iter_json_records(path: str, chunk_bytes: int = CHUNK_BYTES,
                      limit: Optional[int] = None) -> Iterator[Tuple[Optional[str], Any, int, int]]:
    """Yield ``(key, value, byte_offset, byte_length)`` for each item of a top-level array or object.

    ``key`` is None for array items. ``limit`` stops after that many items.
    """
    with open(path, "rb") as f:
        r = _Reader(f, path, chunk_bytes)
        head = r.peek()
        if head == "\ufeff":  # BOM
            r.pos += 1
            r.byte_pos += 3
            head = r.peek()
        if head not in "[{":
            raise ValueError(f"{path}: expected a JSON array or object, found {head!r}")
        is_array = head == "["
        close = "]" if is_array else "}"
        r.expect(head)
        if r.peek() == close:
            return
        count = 0
        while True:
            if limit is not None and count >= limit:
                return
            key = None
            if not is_array:
                key, _, _ = r.value()
                if not isinstance(key, str):
                    raise ValueError(f"{path}: object key at byte {r.byte_pos} is not a string")
                r.expect(":")
            value, start, nbytes = r.value()
            yield key, value, start, nbytes
            count += 1
            if r.expect("," + close) == close:
                return


def read_record(fd: int, offset: int, length: int) -> Any:
    """Decode the JSON value stored at ``[offset, offset + length)`` of an open file descriptor."""
    data = os.pread(fd, int(length), int(offset))
    return json.loads(data)


__all__ = ["iter_json_records", "read_record"]
