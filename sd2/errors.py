"""Errors that name the request field they are about, so callers (the CLI, the service) report the field
without reading the message."""

from __future__ import annotations


class InvalidValue(ValueError):
    """A value the library refuses; `field` names it as the request spells it ("k", "messages")."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
