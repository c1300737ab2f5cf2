"""The event loop every MCP connection of the process lives on.

The ``mcp`` SDK is async (anyio): a connection's transport and session are context managers
that must be entered and left by one task. chatflow runs tools on worker threads and serves
sync and async callers alike, so each server's connection is owned by a task on one private
event loop, on a daemon thread started when the first server starts. Callers reach it with
:func:`run` (sync, from any thread but that loop's) or :func:`arun` (from any event loop).

At interpreter exit every server still running is stopped (:func:`stop_all`, registered with
``atexit``): a stdio server runs in a session of its own, so nothing else would end it.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import threading
import weakref
from collections.abc import Coroutine, Iterable
from typing import Any

from ..typevars import T

__all__ = ["arun", "loop", "register", "run", "stop_all", "submit"]

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None


_started: weakref.WeakSet[Any] = weakref.WeakSet()


def loop() -> asyncio.AbstractEventLoop:
    """The MCP event loop, started (on a daemon thread) on first use."""
    global _loop, _thread
    with _lock:
        if _loop is None or _loop.is_closed():
            made = asyncio.new_event_loop()
            ready = threading.Event()

            def serve() -> None:
                asyncio.set_event_loop(made)
                made.call_soon(ready.set)
                made.run_forever()

            _thread = threading.Thread(target=serve, name="chatflow-mcp", daemon=True)
            _thread.start()
            ready.wait()
            _loop = made
        return _loop


def submit(coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Schedule ``coro`` on the MCP loop; its future (cancelling it cancels the task)."""
    return asyncio.run_coroutine_threadsafe(coro, loop())


def run(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coro`` on the MCP loop and wait for it (from any thread but the loop's own).

    Raises what ``coro`` raises; ``TimeoutError`` after ``timeout`` seconds (the task is
    cancelled then).
    """
    future = submit(coro)
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise TimeoutError(f"no answer within {timeout:g} s") from None
    except BaseException:
        future.cancel()
        raise


async def arun(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` on the MCP loop from any event loop (directly when already on it)."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:  # pragma: no cover - always called from a coroutine
        running = None
    if running is not None and running is _loop:
        return await coro
    return await asyncio.wrap_future(submit(coro))


def register(server: Any) -> None:
    """Remember a started server, so :func:`stop_all` stops it at exit."""
    _started.add(server)


def stop_all(servers: Iterable[Any] | None = None, timeout: float = 5.0) -> None:
    """Stop ``servers`` (default: every server this process started and still runs) all at
    once, each within ``timeout`` s: a server may take a while to exit once its stdin ends, and
    one-by-one those waits would add up."""
    chosen = [s for s in (list(_started) if servers is None else servers) if getattr(s, "_task", None) is not None]
    if not chosen or _loop is None or _loop.is_closed():
        return

    async def every() -> None:
        await asyncio.gather(*(s._shutdown(timeout) for s in chosen), return_exceptions=True)

    try:
        run(every(), timeout + 1)
    except Exception:  # noqa: BLE001 - stopping: nothing left to tell
        pass


atexit.register(stop_all)
