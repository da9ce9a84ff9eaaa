"""``vllm.utils.network_utils`` of the fake vLLM: the two helpers TRL's server client imports."""

from __future__ import annotations

import socket


def get_ip() -> str:
    return "127.0.0.1"


def get_open_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
