"""HTTP clients that retry: one ``requests`` session per client, urllib3's ``Retry`` doing the work.

Used by the clients of the servers a run talks to (OpenAI-compatible world-model endpoints,
Robometer's evaluation server). ``requests`` comes with the domain extras (transformers pulls it);
it is imported only when a client is built, so ``wmrl.core`` keeps its base dependencies.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["RETRYABLE_STATUS", "retrying_session"]

#: Replies worth trying again: a timeout, too many requests, a server error or an unavailable one.
RETRYABLE_STATUS = (408, 429, 500, 502, 503, 504)


def retrying_session(
    retries: int,
    backoff_s: float,
    pool: int = 10,
    status: Iterable[int] = RETRYABLE_STATUS,
    read_retries: int | None = None,
) -> Any:
    """A ``requests.Session`` that retries connection errors, read timeouts and ``status`` replies
    ``retries`` times (GET and POST), waiting ``backoff_s``, then twice as long each time; after the
    last try the last reply is returned (its body says why) or the connection error raised.

    Args:
        retries: extra tries after the first.
        backoff_s: the first wait, in seconds (0: none).
        pool: connections kept per host (requests in flight at once).
        status: HTTP status codes retried.
        read_retries: tries again after a read timeout (``None``: ``retries``); 0 where a request
            that timed out would only time out again (a long generation, a weight reload).
    """
    import requests
    from requests.adapters import HTTPAdapter
    from urllib3.util.retry import Retry

    retry = Retry(
        total=retries,
        connect=retries,
        read=retries if read_retries is None else read_retries,
        status=retries,
        other=0,
        backoff_factor=backoff_s,
        status_forcelist=tuple(status),
        allowed_methods=frozenset({"GET", "POST"}),
        raise_on_status=False,
    )
    session = requests.Session()
    adapter = HTTPAdapter(max_retries=retry, pool_connections=pool, pool_maxsize=pool)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session
