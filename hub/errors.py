"""The hub's errors: each names what was wrong and where, in one line.

>>> raise ModuleNotFound("no module 'foo' is installed; installed: digits_cnn 1.0.0")
Traceback (most recent call last):
paddlejax.hub.errors.ModuleNotFound: no module 'foo' is installed; installed: digits_cnn 1.0.0
"""
from __future__ import annotations


class HubError(ValueError):
    """Anything the hub refuses: a bad module, a bad archive, a missing module, a bad request."""


class ModuleFormatError(HubError):
    """A module directory or its ``module.json`` is malformed, incomplete or tampered with."""


class ArchiveError(HubError):
    """An archive is hostile, damaged or over the limits; nothing was written."""


class ModuleNotFound(HubError):
    """No installed, registered or built-in module matches the name and version asked for."""


class RegistryError(HubError):
    """A registry's index is unreadable or malformed, or a download failed or mismatched."""


class RequestError(HubError):
    """A request to a module (in process or over HTTP) is malformed or over a limit.

    ``status`` is the HTTP status the server answers with (400 unless said otherwise).
    """

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status
