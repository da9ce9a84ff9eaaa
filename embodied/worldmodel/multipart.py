"""``multipart/form-data`` bodies as Robometer's evaluation server exchanges them (stdlib only).

The client side builds what ``requests.post(url, data=..., files=...)`` sends (form fields first,
then the files); the server side parses with the standard library's MIME parser, so each side is
checked against an implementation that is not its mirror image.
"""

from __future__ import annotations

import email.parser
import email.policy
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["FormPart", "encode_multipart", "parse_multipart"]


@dataclass
class FormPart:
    """One form field (``filename is None``) or file of a multipart body."""

    name: str
    data: bytes
    filename: str | None = None
    content_type: str | None = None


def _quote(value: str) -> str:
    if any(c in value for c in '"\r\n'):
        raise ValueError(f"form names and file names must not contain quotes or line breaks; got {value!r}")
    return value


def encode_multipart(parts: Sequence[FormPart]) -> tuple[bytes, str]:
    """The body and its ``Content-Type`` header value (with a random boundary)."""
    boundary = uuid.uuid4().hex
    chunks: list[bytes] = []
    for part in parts:
        disposition = f'form-data; name="{_quote(part.name)}"'
        if part.filename is not None:
            disposition += f'; filename="{_quote(part.filename)}"'
        head = f"--{boundary}\r\nContent-Disposition: {disposition}\r\n"
        if part.content_type is not None:
            head += f"Content-Type: {part.content_type}\r\n"
        chunks += [head.encode("utf-8"), b"\r\n", part.data, b"\r\n"]
    chunks.append(f"--{boundary}--\r\n".encode())
    return b"".join(chunks), f"multipart/form-data; boundary={boundary}"


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
        data = sub.get_payload(decode=True) or b""
        parts.append(FormPart(str(name), data, sub.get_filename(), sub.get_content_type()))
    return parts
