"""Cancel requests, and driving a turn from sync and async callers.

A turn runs as a generator of events on one thread. It stops when its
:class:`CancelToken` is set: by the caller's ``threading.Event``, by Ctrl-C in the main
thread (:func:`ctrl_c_cancels`), or by the cancellation of the ``run_async`` task that
waits for it (:func:`events_from_worker`). Setting the token also cancels the model
stream of the request in flight, so a read blocked on a silent server wakes at once.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

from .typevars import T

if TYPE_CHECKING:  # pragma: no cover
    import asyncio

__all__ = [
    "CANCEL_GRACE_S",
    "INTERRUPT_POLL_S",
    "INTERRUPT_REQUESTED",
    "RUN_WORKERS",
    "CancelToken",
    "Cancelled",
    "RunPool",
    "cancel_main_thread_runs",
    "ctrl_c_cancels",
    "events_from_worker",
    "interruptions",
    "pool",
    "watch_interrupt_requests",
]

log = logging.getLogger("chatflow_cli.core.runner")


class Cancelled(Exception):
    """The cancel token was set (internal to the Runner; callers see ``RunInterrupted``)."""


def interruptions() -> tuple[type[BaseException], ...]:
    """What interrupts a turn: Ctrl-C, :class:`Cancelled`, a consumer gone (``GeneratorExit``)
    and, once asyncio is imported, ``asyncio.CancelledError`` (none can be raised before, and
    a sync turn does not import asyncio to catch it)."""
    stops: tuple[type[BaseException], ...] = (KeyboardInterrupt, Cancelled, GeneratorExit)
    exceptions = sys.modules.get("asyncio.exceptions")
    return stops if exceptions is None else (*stops, exceptions.CancelledError)


class CancelToken:
    """A cancel request: the caller's ``threading.Event`` plus the model stream to close at once.

    When the Runner owns the token (Ctrl-C in the main thread, a cancelled ``run_async``
    task), :meth:`set` closes the stream's socket itself. When the caller passed its own
    event, :meth:`watch` polls it every 50 ms during a request, so a server that has gone
    silent cannot hold a cancelled run until the read timeout.

    Attributes:
        event: the ``threading.Event`` passed to the model client as ``cancel``.
        external: the event is the caller's (it can be set without :meth:`set`).
        stream: the model stream of the request in flight, or ``None``.
        reason: why the turn stops, recorded in its ``turn.interrupted`` event:
            ``"cancelled"``, or :data:`INTERRUPT_REQUESTED` when another process asked.
    """

    __slots__ = ("event", "external", "stream", "reason")

    def __init__(self, event: threading.Event | None = None) -> None:
        self.external = event is not None
        self.event = event if event is not None else threading.Event()
        self.stream: Any = None
        self.reason = "cancelled"

    def is_set(self) -> bool:
        return self.event.is_set()

    def set(self) -> None:
        """Request the cancel and cancel the stream in flight."""
        self.event.set()
        _cancel_stream(self.stream)

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the cancel; ``True`` once requested."""
        return self.event.wait(timeout)

    def watch(self, stream: Any) -> Callable[[], None]:
        """Cancel ``stream`` as soon as the token is set, until the returned ``stop()`` is called."""
        self.stream = stream
        if not self.external:
            def forget() -> None:
                self.stream = None

            return forget
        done = threading.Event()

        def watcher() -> None:
            while not done.is_set():
                if self.event.wait(0.05):
                    if not done.is_set():
                        _cancel_stream(stream)
                    return

        threading.Thread(target=watcher, name="chatflow-cancel-watch", daemon=True).start()

        def stop() -> None:
            done.set()
            self.stream = None

        return stop


def _cancel_stream(stream: Any) -> None:
    if stream is not None and hasattr(stream, "cancel"):
        try:
            stream.cancel()  # wakes a read blocked on a silent server
        except Exception as exc:  # noqa: BLE001 - best effort; the event alone stops it at the next chunk
            log.debug("closing the model stream on cancel failed: %s", exc)


#: The cancel tokens of the runs going on in the main thread (:func:`ctrl_c_cancels`).
_main_thread_runs: list[CancelToken] = []


def cancel_main_thread_runs() -> bool:
    """Stop the runs going on in the main thread as a first Ctrl-C does (their tokens set:
    each stores its partial reply as interrupted); for a signal handler of the caller's,
    such as the command line's SIGTERM. False when no run was left to stop (none runs, or
    every one was asked already: a second signal should stop at once)."""
    pending = [token for token in _main_thread_runs if not token.is_set()]
    for token in pending:
        token.set()
    return bool(pending)


@contextlib.contextmanager
def ctrl_c_cancels(token: CancelToken) -> Iterator[None]:
    """While the block runs in the main thread with Python's default SIGINT handler, the
    first Ctrl-C sets ``token`` (so it never lands inside a database write) and a second
    one raises ``KeyboardInterrupt`` at once. Elsewhere nothing changes. In the main
    thread the token is also listed for :func:`cancel_main_thread_runs`."""
    previous = None
    main = threading.current_thread() is threading.main_thread()
    if main:
        _main_thread_runs.append(token)
        try:
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                def on_sigint(signum: int, frame: Any) -> None:
                    if token.is_set():  # a second Ctrl-C: stop right now
                        raise KeyboardInterrupt
                    token.set()

                previous = signal.signal(signal.SIGINT, on_sigint)
        except ValueError:  # not the main interpreter's main thread after all
            previous = None
    try:
        yield
    finally:
        if main:
            _main_thread_runs.remove(token)
        if previous is not None:
            try:
                signal.signal(signal.SIGINT, previous)
            except ValueError:
                pass


# --------------------------------------------------------------------------------------
# the worker pool of run_async
# --------------------------------------------------------------------------------------
class RunPool:
    """A shared pool of at most ``size`` daemon threads running ``run_async`` turns.

    Threads start on demand and stay for later runs; work beyond ``size`` concurrent runs
    waits in a FIFO queue. Daemon threads, like the tool threads: a run still going never
    holds up the process's exit.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self.threads = 0
        self._outstanding = 0  # jobs queued or running

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` on a pool thread (a new one while fewer than ``size`` are busy)."""
        with self._lock:
            self._outstanding += 1
            start = self.threads < self.size and self._outstanding > self.threads
            if start:
                self.threads += 1
        self._jobs.put(job)
        if start:
            threading.Thread(target=self._serve, name="chatflow-run", daemon=True).start()

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job()
            except BaseException:  # noqa: BLE001 - a job reports its own errors
                log.exception("a run_async job failed")
            finally:
                with self._lock:
                    self._outstanding -= 1


#: Threads of the shared pool that runs ``run_async`` turns (each blocks on the model's
#: network reply and short store transactions; the event loop never does). More busy
#: threads make the event loop wait longer for the GIL: 200 concurrent runs with a model
#: that answers at once stall the loop about 0.2 s with 32 threads, about 1 s with one
#: thread per run (tests/benchmarks/bench_webhook.py). Change it with set_run_workers().
RUN_WORKERS = 16
#: The pool :func:`events_from_worker` submits to (replace it to measure another size).
pool = RunPool(RUN_WORKERS)

#: Longest a cancelled ``run_async`` task waits for its worker to store the interrupted turn
#: (seconds). Only a request still connecting (no response headers yet) can take that long;
#: the worker then stores the interruption by itself when the request gives up.
CANCEL_GRACE_S = 10.0


async def events_from_worker(turn: Callable[[CancelToken, asyncio.AbstractEventLoop], Iterator[T]]
                             ) -> AsyncIterator[T]:
    """Run ``turn(cancel, loop)`` on a :data:`pool` thread, yielding its events on the event loop.

    The worker's exception is raised here. When the awaiting task is cancelled (or the
    consumer stops early), the token is set and the task waits up to :data:`CANCEL_GRACE_S`
    for the worker to store the interrupted turn before ``CancelledError`` propagates.
    """
    import asyncio

    loop = asyncio.get_running_loop()
    cancel = CancelToken()
    events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    done = threading.Event()

    def put(kind: str, value: Any) -> None:
        try:
            loop.call_soon_threadsafe(events.put_nowait, (kind, value))
        except RuntimeError:  # the loop is closed: nobody listens any more
            pass

    def work() -> None:
        try:
            for event in turn(cancel, loop):
                put("event", event)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            put("error", exc)
        else:
            put("end", None)
        finally:
            done.set()

    pool.submit(work)
    try:
        while True:
            kind, value = await events.get()
            if kind == "event":
                yield value
            elif kind == "error":
                raise value
            else:
                return
    except (asyncio.CancelledError, GeneratorExit):
        # interrupt the turn and let the worker store it as interrupted before we go
        cancel.set()
        await _wait_thread(done)
        raise
    finally:
        cancel.set()  # an early exit of the consumer interrupts a turn still going


async def _wait_thread(done: threading.Event) -> None:
    import asyncio

    deadline = time.monotonic() + CANCEL_GRACE_S
    while not done.is_set() and time.monotonic() < deadline:
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:  # keep waiting: the turn must be stored first
            continue


#: Seconds between two looks, while a turn runs, at whether another process asked it to stop
#: (``store.request_interrupt``; ``chatflow sessions interrupt``).
INTERRUPT_POLL_S = 0.25
#: The ``reason`` of a turn stopped at another process's request.
INTERRUPT_REQUESTED = "interrupt requested"


def watch_interrupt_requests(store: Any, session_id: str, lease: str | None,
                             cancel: CancelToken) -> Callable[[], None]:
    """Poll ``store.interrupt_requested`` every :data:`INTERRUPT_POLL_S` while a turn runs; a
    request sets ``cancel`` (the turn stops at its next chunk or tool boundary). Returns the
    function that stops watching. A store without the method, or a turn without a lease
    token, is not watched."""
    look = getattr(store, "interrupt_requested", None)
    if look is None or lease is None:
        return lambda: None
    done = threading.Event()

    def watch() -> None:
        while not done.wait(INTERRUPT_POLL_S):
            try:
                asked = look(session_id, lease)
            except Exception as exc:  # noqa: BLE001 - the turn's own writes report a store that fails
                log.debug("could not look for an interrupt request: %s", exc)
                continue
            if asked and not done.is_set():
                cancel.reason = INTERRUPT_REQUESTED
                cancel.set()
                return

    threading.Thread(target=watch, name="chatflow-interrupt-watch", daemon=True).start()
    return done.set
