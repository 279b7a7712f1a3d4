"""Retry Google Cloud calls that were refused for load (rate limits, 503), with bounded exponential backoff.

Every API call dsctl makes goes through `call()`, with the client's own retry
switched off, so there is one policy: up to ATTEMPTS tries, waits doubling from
DSCTL_GCP_RETRY_BASE_S (default 0.5 s) up to 16 s, with jitter; about a minute in
all. Inserts carry a request id, so a retried insert that had in fact succeeded
is not done twice (the API answers with the first operation).

A 429 is RESOURCE_EXHAUSTED, which Google uses both for a rate limit (retry) and
for an exhausted quota (never retry: it will not pass; errors.py names it). They
are told apart by the error's reason and message.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time
from typing import Callable, TypeVar

from .errors import ApiUnavailable

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


_RATE_REASONS = {"rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED"}
_QUOTA_REASONS = {"quotaExceeded", "QUOTA_EXCEEDED", "RESOURCE_QUOTA_EXCEEDED"}
_PER_TIME = re.compile(r"per (second|minute|100 seconds|day)", re.IGNORECASE)


def _reasons(exc: Exception) -> set[str]:
    out = {e.get("reason") for e in (getattr(exc, "errors", None) or []) if isinstance(e, dict)}
    reason = getattr(exc, "reason", None)  # google.rpc.ErrorInfo, when the API sent one
    return {r for r in out | {reason} if r}


def is_rate_limit(exc: Exception) -> bool:
    """A request-rate limit (retry later): its reason says so, or its quota is per unit of time."""
    return bool(_reasons(exc) & _RATE_REASONS) or bool(_PER_TIME.search(getattr(exc, "message", None) or str(exc)))


def is_quota(exc: Exception) -> bool:
    """An exhausted resource quota (CPUs, GPUs, TPUs, addresses): retrying cannot help."""
    if is_rate_limit(exc):
        return False
    text = (getattr(exc, "message", None) or str(exc)).lower()
    return bool(_reasons(exc) & _QUOTA_REASONS) or "quota" in text


def _retryable(exc: Exception, timeouts: bool) -> bool:
    from google.api_core import exceptions as gx

    if isinstance(exc, gx.TooManyRequests):  # ResourceExhausted is one: a rate limit or a quota
        return not is_quota(exc)
    if isinstance(exc, gx.ServiceUnavailable):
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
    """fn(*args, retry=None, timeout=60, **kwargs), retried on 429/503/connection errors (and
    client-side timeouts unless retry_timeouts is false: then they are raised to the caller)."""
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
                raise
            if attempt == ATTEMPTS:
                raise ApiUnavailable(
                    f"Google Cloud kept refusing {doing} ({type(exc).__name__}: {getattr(exc, 'message', exc)}) "
                    f"after {ATTEMPTS} attempts over {time.monotonic() - started:.0f} s. The API is overloaded or "
                    "the project's request-rate quota (API requests per minute) is too low; try again later."
                ) from exc
            wait = min(base * 2 ** (attempt - 1), MAX_WAIT_S)
            sleep(wait * random.uniform(0.8, 1.2), cancel)
    raise AssertionError("unreachable")
