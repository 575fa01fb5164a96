"""How the proxy's HTTP server treats a slow client: a request's headers must arrive
within `header_timeout_s` and stay under `max_header_bytes`, and a client that stops
reading its response is dropped after `send_timeout_s`.

uvicorn has neither. Its keep-alive timeout starts only after a response, so a fresh
connection that sends its headers a byte at a time (or nothing at all) is kept forever;
and with httptools installed (uvicorn's "auto" choice) its `h11_max_incomplete_event_size`
does not apply, so headers of any size were taken. `guarded_protocol` wraps the HTTP
protocol class uvicorn would use (httptools, else h11) with both limits: the clock starts
when the connection opens and again when a new request on a kept-alive connection
begins, and stops when the headers are complete (the body then has the proxy's own
`body_timeout_s`). A client over a limit gets vLLM's error shape (408 or 431) and the
connection is closed; so does a request uvicorn cannot parse (400, where uvicorn's own
answer is plain text).

A client that stops reading a response holds its connection, the kernel's send queue
(megabytes on loopback) and, through it, the upstream stream, for as long as it likes:
uvicorn waits for the transport to drain without a clock. When the transport stays full
(paused for writing) for `send_timeout_s`, the connection is reset; the response's
stream then ends as a client's disconnect does (the upstream request is cancelled). nginx
does the same with its `send_timeout` (60 s by default, also the lab's default).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import h11 as h11_
from uvicorn.protocols.http.auto import AutoHTTPProtocol
from uvicorn.protocols.http.h11_impl import H11Protocol

from lab_utils.serve.proxy_settings import ProxySettings

log = logging.getLogger("lab_utils.proxy")

MAX_HEADER_BYTES = 64 * 1024  # a request's headers beyond this are refused
REASONS = {400: "Bad Request", 408: "Request Timeout", 431: "Request Header Fields Too Large"}


def _error_response(status: int, kind: str, message: str) -> bytes:
    body = json.dumps({"error": {"message": message, "type": kind, "param": None,
                                 "code": status}}).encode()
    return (f"HTTP/1.1 {status} {REASONS[status]}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body


class _HeaderGuard:
    """Mixed into a uvicorn HTTP protocol class (see the module docstring)."""

    header_timeout_s: float = 10.0
    max_header_bytes: int = 64 * 1024
    send_timeout_s: float = 60.0
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop

    def _awaiting_headers(self) -> bool:  # per parser
        raise NotImplementedError

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]  # uvicorn's protocol class is untyped
        self._header_bytes = 0
        self._header_timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None
        self._arm()

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        self._header_bytes = 0

    def data_received(self, data: bytes) -> None:
        super().data_received(data)  # type: ignore[misc]  # uvicorn's protocol class is untyped
        if self.transport.is_closing():
            self._disarm()
        elif self._awaiting_headers():
            self._arm()  # a new request on a kept-alive connection has begun
            self._header_bytes += len(data)
            if self._header_bytes > self.max_header_bytes:
                self._refuse(431, "header_too_large", "the request's headers exceed "
                             f"{self.max_header_bytes} bytes")
        else:
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._reading_again()
        super().connection_lost(exc)  # type: ignore[misc]  # uvicorn's protocol class is untyped

    def pause_writing(self) -> None:  # the transport's buffer is full: the client is not reading
        super().pause_writing()  # type: ignore[misc]  # uvicorn's protocol class is untyped
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.send_timeout_s, self._not_reading)

    def resume_writing(self) -> None:
        self._reading_again()
        super().resume_writing()  # type: ignore[misc]  # uvicorn's protocol class is untyped

    def _reading_again(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _not_reading(self) -> None:
        self._send_timer = None
        log.warning("a client read nothing of its response for %g s (proxy.send_timeout_s): "
                    "connection reset", self.send_timeout_s)
        self.transport.abort()  # close() would wait for the client to read the buffer

    def send_400_response(self, msg: str) -> None:
        """What uvicorn answers a request it cannot parse, in vLLM's error shape (its own
        answer is plain text); the connection is closed."""
        self._refuse(400, "BadRequestError", f"{msg.rstrip('.')}: not an HTTP/1.1 request "
                     "the proxy can read")

    def _too_slow(self) -> None:
        self._header_timer = None
        self._refuse(408, "header_timeout", "the request's headers were not received within "
                     f"{self.header_timeout_s:g} s")

    def _refuse(self, status: int, kind: str, message: str) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self.transport.write(_error_response(status, kind, message))
            self.transport.close()


class _GuardedH11(_HeaderGuard, H11Protocol):
    def _awaiting_headers(self) -> bool:
        return self.conn.their_state is h11_.IDLE


class _GuardedHttpTools(_HeaderGuard):  # a base is added in guarded_protocol
    _headers_done = False

    def _awaiting_headers(self) -> bool:
        return not self._headers_done

    def on_message_begin(self) -> None:
        self._headers_done = False
        super().on_message_begin()  # type: ignore[misc]  # uvicorn's protocol class is untyped

    def on_headers_complete(self) -> None:
        self._headers_done = True
        super().on_headers_complete()  # type: ignore[misc]  # uvicorn's protocol class is untyped


def guarded_protocol(header_timeout_s: float, max_header_bytes: int, h11: bool = False,
                     send_timeout_s: float = 60.0) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class (`http=` of `uvicorn.Config`) with the limits;
    `h11`: on h11 even where httptools is installed."""
    limits: dict[str, Any] = {"header_timeout_s": header_timeout_s,
                              "max_header_bytes": max_header_bytes,
                              "send_timeout_s": send_timeout_s}
    if h11 or issubclass(AutoHTTPProtocol, H11Protocol):
        return type("GuardedH11Protocol", (_GuardedH11,), limits)
    return type("GuardedHttpToolsProtocol", (_GuardedHttpTools, AutoHTTPProtocol), limits)


def server_options(settings: ProxySettings) -> dict[str, Any]:
    """uvicorn's settings for the proxy (`uvicorn.Config`/`uvicorn.run` keywords): the
    HTTP protocol with the header limits; h11's own limit too, where h11 parses."""
    return dict(http=guarded_protocol(settings.header_timeout_s, MAX_HEADER_BYTES,
                                      send_timeout_s=settings.send_timeout_s),
                h11_max_incomplete_event_size=MAX_HEADER_BYTES, log_level="warning",
                access_log=False, timeout_graceful_shutdown=5)
