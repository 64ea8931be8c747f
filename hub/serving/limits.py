"""What the server accepts: sizes of bodies, requests and items, time, concurrency and queues.

>>> Limits().max_body_bytes == 8 << 20
True
>>> Limits(max_items=8, max_queue=64).max_items
8
>>> Limits(max_items=100, max_queue=10)
Traceback (most recent call last):
    ...
ValueError: Limits: max_queue (10) must hold at least one request of max_items (100)
"""
from __future__ import annotations

import dataclasses
import numbers


@dataclasses.dataclass(frozen=True)
class Limits:
    """The server's limits; a request over one of them is refused with a JSON error.

    - ``max_body_bytes`` (8 MiB): the largest request body; a larger one is answered 413,
      without reading it when its ``Content-Length`` says so, else as soon as the bytes
      received pass the limit.
    - ``max_items`` (256): texts or images in one request (the module answers 413 or 400).
    - ``max_text_chars`` (10,000): characters in one text.
    - ``max_image_bytes`` (4 MiB): one image, decoded from base64 (not yet from PNG/JPEG).
    - ``max_image_pixels`` (4096 * 4096): width times height of one decoded image.
    - ``request_timeout_s`` (30): seconds from a request's arrival to its answer: a body
      still arriving then is answered 408, results still missing 504. Also the bound on
      the drain at shutdown.
    - ``max_concurrency`` (256): prediction requests in flight at once (reading their body,
      queued or computing); one more is answered 503.
    - ``max_queue`` (4096): items waiting per module; a request that would pass it is
      answered 503.

    The module reads the item limits (``parse_request(payload, limits)``); the server
    enforces the others.

    >>> Limits(request_timeout_s=5).request_timeout_s
    5
    """

    max_body_bytes: int = 8 << 20
    max_items: int = 256
    max_text_chars: int = 10_000
    max_image_bytes: int = 4 << 20
    max_image_pixels: int = 4096 * 4096
    request_timeout_s: float = 30.0
    max_concurrency: int = 256
    max_queue: int = 4096

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            kind = numbers.Real if field.name == "request_timeout_s" else numbers.Integral
            if not isinstance(value, kind) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"Limits: {field.name} must be a positive "
                                 f"{'number' if kind is numbers.Real else 'int'}, got {value!r}")
        # a request is queued whole, so one at the largest size must fit in an empty queue
        if self.max_queue < self.max_items:
            raise ValueError(f"Limits: max_queue ({self.max_queue}) must hold at least one request of "
                             f"max_items ({self.max_items})")
