"""``multipart/form-data`` bodies as Robometer's evaluation server reads them: the standard
library's MIME parser (the client encodes with urllib3, as ``requests`` does)."""

from __future__ import annotations

import email.parser
import email.policy
from dataclasses import dataclass
from typing import cast

__all__ = ["FormPart", "parse_multipart"]


@dataclass
class FormPart:
    """One form field (``filename is None``) or file of a multipart body."""

    name: str
    data: bytes
    filename: str | None = None
    content_type: str | None = None


def parse_multipart(body: bytes, content_type: str) -> list[FormPart]:
    """Split a ``multipart/form-data`` body into its parts (the standard library's MIME parser).

    Raises:
        ValueError: not a multipart body, or a part without a name.
    """
    if not content_type.lower().startswith("multipart/form-data"):
        raise ValueError(f"expected a multipart/form-data body; got Content-Type {content_type!r}")
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
    )
    if not message.is_multipart():
        raise ValueError("the multipart body could not be parsed (boundary missing or malformed)")
    parts = []
    for sub in message.iter_parts():
        name = sub.get_param("name", header="content-disposition")
        if not name:
            raise ValueError("a multipart part has no form name")
        # decode=True: the bytes of a leaf part, None for a nested multipart (typeshed's union is wider)
        data = cast(bytes | None, sub.get_payload(decode=True)) or b""
        parts.append(FormPart(str(name), data, sub.get_filename(), sub.get_content_type()))
    return parts
