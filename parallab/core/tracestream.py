"""A Chrome trace read one event at a time: memory bounded by the events kept, not by the file.

`json.loads` of a profiler's trace holds the file's whole text and every event it decodes at once
(a rank's trace of a long window is hundreds of MB of text before a single event is looked at).
`iter_events` reads the file in chunks and decodes each element of the top-level `traceEvents`
array as it comes (the C decoder on each element, `json.JSONDecoder.raw_decode`), handing it to
the caller, which keeps what it needs; the other top-level keys (`deviceProperties`,
`distributedInfo`, …) are collected into `meta` as they pass. Its buffer holds one chunk plus
the element being decoded.

Bad input is named, never a partial answer passed as whole: a file that ends inside the document
raises `TruncatedTrace`; one that is not a JSON object with a `traceEvents` array raises
`NotATrace`. Standard library only.
"""

from __future__ import annotations

import gzip
import io
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, cast

CHUNK_CHARS = 1 << 20
_WS = re.compile(r"[ \t\n\r]*")


class NotATrace(ValueError):
    """The file is not a Chrome trace (not a JSON object, or no `traceEvents` array)."""


class TruncatedTrace(NotATrace):
    """The file ends inside the trace (a write cut short)."""


class _Reader:
    def __init__(self, stream: IO[str], chunk_chars: int):
        self.stream, self.chunk = stream, chunk_chars
        self.buf, self.pos, self.eof = "", 0, False
        keys: dict[str, str] = {}

        def shared_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
            # One string object per distinct key across events, as json.loads shares them within
            # one document (its memo lives for one decode call: here, one event).
            return {keys.setdefault(k, k): v for k, v in pairs}

        self.decoder = json.JSONDecoder(object_pairs_hook=shared_keys)

    def fill(self) -> None:
        data = self.stream.read(self.chunk)
        if not data:
            self.eof = True
        self.buf = self.buf[self.pos :] + data
        self.pos = 0

    def skip_ws(self) -> str:
        """The next non-blank character ('' at the end of the file), not consumed."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if self.eof:
                return ""
            self.fill()

    def take(self, allowed: str, where: str) -> str:
        ch = self.skip_ws()
        if not ch:
            raise TruncatedTrace(f"the trace ends {where}")
        if ch not in allowed:
            raise NotATrace(f"expected one of {allowed!r} {where}, found {ch!r}")
        self.pos += 1
        return ch

    def value(self, where: str) -> Any:
        while True:
            if not self.skip_ws():
                raise TruncatedTrace(f"the trace ends {where}")
            try:
                value, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if self.eof:
                    if exc.pos >= len(self.buf) - 1 or exc.msg.startswith("Unterminated string"):
                        raise TruncatedTrace(f"the trace ends {where} ({exc.msg})") from None
                    raise NotATrace(f"bad JSON {where}: {exc.msg}") from None
                self.fill()
                continue
            if end >= len(self.buf) and not self.eof:  # a number or literal may go on in the next chunk
                self.fill()
                continue
            self.pos = end
            return value


def iter_events(stream: IO[str], meta: dict[str, Any] | None = None, *, chunk_chars: int = CHUNK_CHARS) -> Iterator[dict[str, Any]]:
    """Each element of the trace's `traceEvents`, in file order; the document's other top-level
    keys go into `meta` as they are read (those after the events once the iterator is exhausted).
    TruncatedTrace or NotATrace when the file is not a whole trace."""
    r = _Reader(stream, chunk_chars)
    r.take("{", "before the document")
    seen = False
    if r.skip_ws() == "}":
        r.pos += 1
    else:
        while True:
            key = r.value("at a top-level key")
            if not isinstance(key, str):
                raise NotATrace("a top-level key is not a string")
            r.take(":", f"after the key {key!r}")
            if key == "traceEvents":
                seen = True
                r.take("[", "at traceEvents")
                if r.skip_ws() == "]":
                    r.pos += 1
                else:
                    while True:
                        event = r.value("inside traceEvents")
                        if isinstance(event, dict):
                            yield event
                        if r.take(",]", "inside traceEvents") == "]":
                            break
            else:
                found = r.value(f"in the value of {key!r}")
                if meta is not None:
                    meta[key] = found
            if r.take(",}", "between top-level keys") == "}":
                break
    if not seen:
        raise NotATrace("no traceEvents array")
    if r.skip_ws():
        raise NotATrace("data after the document")


def open_trace(path: Path) -> IO[str]:
    """The trace at `path` as text (gunzipped when it is gzip)."""
    with path.open("rb") as probe:
        gz = probe.read(2) == b"\x1f\x8b"
    raw = cast(IO[bytes], gzip.open(path, "rb") if gz else path.open("rb"))  # noqa: SIM115 — the caller closes the wrapper
    return io.TextIOWrapper(raw, encoding="utf-8")


def read_trace(path: Path, keep: Callable[[dict[str, Any]], bool] | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the top-level keys but `traceEvents`, the events `keep` keeps — every one without it),
    streamed from `path` (plain or gzipped JSON)."""
    meta: dict[str, Any] = {}
    with open_trace(path) as stream:
        events = [e for e in iter_events(stream, meta) if keep is None or keep(e)]
    return meta, events


WHOLE_READ_BYTES = 64 << 20
"""A raw trace up to this size is decoded in one `json.loads`; a larger one is streamed."""


def read_document(path: Path) -> dict[str, Any]:
    """The Chrome trace at `path` as a document with its `traceEvents`.

    Decoding element by element (`read_trace`) bounds memory by the events, not the text, but
    costs half again the time of one `json.loads` (a Python call per element and per object): on
    a traced tiny job, the read was the largest part of the window's analysis. So a file up to
    `WHOLE_READ_BYTES` — its text held beside its events for the one call — is decoded whole, and
    a larger one streamed. Anything but a whole trace is read again by the stream, which names
    what is wrong (`TruncatedTrace`, `NotATrace`)."""
    if path.stat().st_size <= WHOLE_READ_BYTES:
        try:
            doc = json.loads(path.read_bytes())
        except ValueError:  # JSONDecodeError, or bytes that are not UTF-8: the stream says which
            doc = None
        if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
            doc["traceEvents"] = [e for e in doc["traceEvents"] if isinstance(e, dict)]  # as the stream yields them
            return doc
    meta, kept = read_trace(path)
    return {**meta, "traceEvents": kept}
