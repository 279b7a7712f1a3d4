"""Doing one thing to many VMs at once: threads that stop together, and their events told on the right thread.

Everything the provider does to more than one VM (SSH to each, start a process on each, wait for
each TPU VM) runs in `parallel`: the first failure cancels the others (through the run's cancel
event, which every wait checks) and is raised once every thread has returned, so no thread goes on
creating or starting things behind an error. Threads report events through a Relay, which hands
them to the orchestrator's thread: its run store and live view are not for other threads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import TypeVar

from ..contract import EventSink
from .retry import Cancelled

SSH_THREADS = 64

T = TypeVar("T")
R = TypeVar("R")


class Relay:
    """An event sink worker threads may call: their events are held and delivered on the thread that made the
    relay (the orchestrator's, which owns the run store's SQLite connection and the live view) when it flushes."""

    def __init__(self, sink: EventSink):
        self.sink = sink
        self.owner = threading.get_ident()
        self.pending: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def __call__(self, kind: str, message: str) -> None:
        if threading.get_ident() != self.owner:
            with self.lock:
                self.pending.append((kind, message))
            return
        self.flush()
        self.sink(kind, message)

    def flush(self) -> None:
        if threading.get_ident() != self.owner:
            return
        with self.lock:
            items, self.pending = self.pending, []
        for kind, message in items:
            self.sink(kind, message)


def relay(events: EventSink) -> Relay:
    return events if isinstance(events, Relay) else Relay(events)


def parallel(fn: Callable[[T], R], items: list[T], *, threads: int = SSH_THREADS,
             cancel: threading.Event | None = None, events: Relay | None = None) -> list[R]:
    """fn(item) for every item in threads; the first exception is raised once every thread has returned.

    On an exception (or Ctrl-C) `cancel` is set first, so the others stop waiting and return quickly.
    Events the threads raise through `events` are delivered while waiting.
    """
    if not items:
        return []
    pool = ThreadPoolExecutor(max_workers=min(len(items), threads), thread_name_prefix="dsctl-ssh")
    futures = [pool.submit(fn, item) for item in items]
    errors: list[BaseException] = []
    try:
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            if events is not None:
                events.flush()
            for f in done:
                exc = f.exception()
                if exc is not None:
                    errors.append(exc)
                    if cancel is not None:
                        cancel.set()
    except BaseException:  # Ctrl-C in the waiting thread
        if cancel is not None:
            cancel.set()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if events is not None:
            events.flush()
    if errors:  # the first real one: the others may only say they were cancelled because of it
        raise next((e for e in errors if not isinstance(e, Cancelled)), errors[0])
    return [f.result() for f in futures]
