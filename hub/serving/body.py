"""Reading a request body within a size and a deadline, never past them.

The ``Content-Length`` header is checked before any byte is read; then the bytes received
are counted as they arrive (chunked bodies have no length), and reading stops as soon as
they pass the limit.

>>> import asyncio
>>> async def receive_from(*chunks):
...     queue = [{"type": "http.request", "body": c, "more_body": i + 1 < len(chunks)} for i, c in enumerate(chunks)]
...     async def receive():
...         return queue.pop(0)
...     return receive
>>> async def read(limit, *chunks):
...     body = Body(await receive_from(*chunks), {}, limit, deadline=asyncio.get_running_loop().time() + 1)
...     try:
...         return await body.read()
...     except RequestError as e:
...         return e.status, str(e), body.complete
>>> asyncio.run(read(10, b'{"a"', b': 1}'))
b'{"a": 1}'
>>> asyncio.run(read(4, b'{"a"', b': 1', b'}'))
(413, 'request body too large: more than 4 bytes', False)
"""
from __future__ import annotations

import asyncio

from paddlejax.hub.errors import RequestError


class ClientGone(Exception):
    """The client disconnected before its body arrived."""


class Body:
    """The body of one request, read from its ASGI ``receive`` at most ``limit`` bytes and
    until the loop time ``deadline``.

    ``complete`` says whether the whole body was received: a response sent before it was
    (an error) should close the connection unless :meth:`discard` reaches the end, so
    that the bytes left over are never read as a next request.
    """

    def __init__(self, receive, headers, limit: int, deadline: float):
        self._receive = receive
        self.limit = limit
        self.deadline = deadline
        self.complete = False
        self.length = _content_length(headers.get("content-length"))

    async def read(self) -> bytes:
        """The whole body; a RequestError 413 past the limit, 408 past the deadline (the
        client is too slow), 400 for a malformed or wrong ``Content-Length``; ClientGone if
        the client left."""
        if self.length is not None and self.length > self.limit:
            raise RequestError(f"request body too large: {self.length} bytes (at most {self.limit})", status=413)
        parts, size = [], 0
        try:
            async with asyncio.timeout_at(self.deadline):
                while not self.complete:
                    chunk = await self._next()
                    size += len(chunk)
                    if size > self.limit:
                        raise RequestError(f"request body too large: more than {self.limit} bytes", status=413)
                    parts.append(chunk)
        except TimeoutError:
            raise RequestError(f"request body not received in time ({size} bytes arrived before the deadline)",
                               status=408) from None
        return b"".join(parts)

    async def discard(self, max_bytes: int, seconds: float) -> bool:
        """Read and drop at most ``max_bytes`` more for at most ``seconds``; whether the body
        then ended (the connection can serve another request)."""
        seen = 0
        try:
            async with asyncio.timeout(max(seconds, 0)):
                while not self.complete and seen <= max_bytes:
                    seen += len(await self._next())
        except (TimeoutError, ClientGone):
            pass
        return self.complete

    async def _next(self) -> bytes:
        message = await self._receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        self.complete = not message.get("more_body", False)
        return message.get("body", b"")


def _content_length(value: str | None) -> int | None:
    if value is None:
        return None
    digits = value.strip()
    if not (digits.isascii() and digits.isdigit() and len(digits) <= 20):
        raise RequestError(f"malformed Content-Length: {value[:40]!r}")
    return int(digits)
