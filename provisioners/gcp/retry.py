"""Retry Google Cloud calls that were refused for load or failed on the server, with bounded exponential backoff.

Every API call dsctl makes goes through `call()`, with the client's own retry
switched off, so there is one policy: up to ATTEMPTS tries, waits doubling from
DSCTL_GCP_RETRY_BASE_S (default 0.5 s) up to 16 s, with jitter; about a minute in
all. What is retried is what Google's guidance lists as retryable: 408, 429 (a rate
limit, not a quota) and every 5xx but 501, and connections that fail or time out
(https://cloud.google.com/storage/docs/retry-strategy,
https://cloud.google.com/apis/design/errors#error_retries). Creates carry a request
id made once, before the first try, so a retried create that had in fact succeeded
is not done twice (the API answers with the first operation). A call that still fails
carries what it was doing (`DOING`), so whatever reaches the user names the call.

A 429 is RESOURCE_EXHAUSTED, which Google uses both for a rate limit (retry) and
for an exhausted quota (never retry: it will not pass). errors.py tells them apart
(by the error's reason and message) and names the quota.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from .errors import DOING, ApiUnavailable, is_quota, is_rate_limit

T = TypeVar("T")
ATTEMPTS = 8
MAX_WAIT_S = 16.0


class Cancelled(Exception):
    """The run is being torn down: stop waiting and return."""


def base_wait_s() -> float:
    try:
        return max(float(os.environ.get("DSCTL_GCP_RETRY_BASE_S", "0.5")), 0.0)
    except ValueError:
        return 0.5


def is_timeout(exc: Exception) -> bool:
    from google.api_core import exceptions as gx

    try:
        import requests
    except ImportError:  # pragma: no cover
        return isinstance(exc, gx.DeadlineExceeded)
    return isinstance(exc, (requests.Timeout, gx.DeadlineExceeded))


def _retryable(exc: Exception, timeouts: bool) -> bool:
    from google.api_core import exceptions as gx

    if isinstance(exc, gx.TooManyRequests):  # ResourceExhausted is one: a rate limit or a quota
        return not is_quota(exc)
    if isinstance(exc, gx.ServerError) and not isinstance(exc, gx.MethodNotImplemented):  # 500, 502, 503, 504
        return True
    if isinstance(exc, gx.GoogleAPICallError) and exc.code == 408:  # Request Timeout (no class of its own)
        return True
    if isinstance(exc, gx.Forbidden) and is_rate_limit(exc):  # Compute Engine's API rate quota answers 403
        return True
    if is_timeout(exc):
        return timeouts
    try:
        import requests
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, requests.ConnectionError)


def sleep(seconds: float, cancel: threading.Event | None) -> None:
    if cancel is None:
        time.sleep(seconds)
    elif cancel.wait(seconds):
        raise Cancelled()


def call(fn: Callable[..., T], *args, doing: str, cancel: threading.Event | None = None,
         retry_timeouts: bool = True, **kwargs) -> T:
    """fn(*args, retry=None, timeout=60, **kwargs), retried on 408/429/5xx/connection errors (and client-side
    timeouts unless retry_timeouts is false: then they are raised to the caller)."""
    kwargs.setdefault("retry", None)
    kwargs.setdefault("timeout", 60.0)
    base = base_wait_s()
    started = time.monotonic()
    for attempt in range(1, ATTEMPTS + 1):
        if cancel is not None and cancel.is_set():
            raise Cancelled()
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if not _retryable(exc, retry_timeouts):
                with contextlib.suppress(AttributeError, TypeError):
                    setattr(exc, DOING, doing)  # what the call was, for the one paragraph a user reads
                raise
            if attempt == ATTEMPTS:
                raise ApiUnavailable(
                    f"Google Cloud kept refusing {doing} ({type(exc).__name__}: {getattr(exc, 'message', exc)}) "
                    f"after {ATTEMPTS} attempts over {time.monotonic() - started:.0f} s. The API is overloaded or failing, "
                    "or the project's request-rate quota (API requests per minute) is too low; try again later."
                ) from exc
            wait = min(base * 2 ** (attempt - 1), MAX_WAIT_S)
            sleep(wait * random.uniform(0.8, 1.2), cancel)
    raise AssertionError("unreachable")
