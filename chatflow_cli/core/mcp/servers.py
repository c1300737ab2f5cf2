"""MCP servers as sources of tools: :class:`MCPServerStdio` and :class:`MCPServerStreamableHttp`.

The names and the async methods follow the OpenAI Agents SDK (``connect``, ``list_tools``,
``call_tool``, ``cleanup``, ``params``, ``name``); each has a sync twin (``start``,
``list_tools_sync``, ``call_tool_sync``, ``stop``) for the Runner's tool threads. Everything
goes through the official ``mcp`` SDK's client (``stdio_client``, ``streamable_http_client``,
``ClientSession``), imported when a server first starts, on one private event loop
(:mod:`._loop`).

Lifecycle: a server starts when it is first needed, and lists its tools then; it keeps
running until :meth:`MCPServer.stop` (the Runner's ``close``; at the latest at the
interpreter's exit). A server that exits, or whose connection closes, is started again by the
next call. With a ``tools_cache`` directory (:mod:`.cache`), the tools it listed last time are
known before it starts: a turn offers them without starting it, and it starts when the model
calls one of them (the tools it lists then replace those kept). Without one, or before its
first listing, the first turn of an agent that uses it starts it (``chatflow mcp ls`` does too).

Faults never escape as exceptions of their own: every one is an :class:`MCPServerError`
(a :class:`~chatflow_cli.core.tools.ToolCallFailed`) whose text names the server, what
happened and the last lines of a stdio server's stderr, so the model gets a tool error
result and the turn goes on:

* the command cannot be run, or the server does not answer ``initialize`` within
  ``start_timeout`` (default :data:`DEFAULT_START_TIMEOUT_S`), or exits first;
* a call gets no answer within ``timeout`` (default :data:`DEFAULT_CALL_TIMEOUT_S`): the
  request is cancelled (``notifications/cancelled``) and the server kept;
* the server exits, or closes the connection, during a call: it is started again next time;
* a result that is not a valid ``CallToolResult`` (or does not fit the tool's output schema);
* an error answer (an unknown tool, bad arguments).

Secrets: values in ``env`` (stdio) and ``headers`` (HTTP) may be references, resolved each
time the server starts (:func:`~chatflow_cli.core.mcp.refs.resolve`): ``vault:VAULT/ENTRY``
or ``env:VAR`` (the whole value), or ``${vault:VAULT/ENTRY}``, ``${env:VAR}``, ``${VAR}``
inside a value; ``command``, ``args`` and ``url`` take the ``${...}`` forms
(:func:`~chatflow_cli.core.mcp.refs.expand`). Resolved values are scrubbed from every
result, error and stderr line; ``describe`` shows the references, never their values.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import logging
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ..resources.secrets import scrub_values
from . import _loop
from .errors import MCPServerError
from .policy import APPROVAL_POLICIES, DEFAULT_CALL_TIMEOUT_S, DEFAULT_START_TIMEOUT_S

if TYPE_CHECKING:  # pragma: no cover
    from .tools import MCPTool

__all__ = ["APPROVAL_POLICIES", "DEFAULT_CALL_TIMEOUT_S", "DEFAULT_START_TIMEOUT_S", "MCPServer", "MCPServerError",
           "MCPServerSelection", "MCPServerStdio", "MCPServerStreamableHttp", "start_all", "stop_all",
           "unknown_tools_note"]

log = logging.getLogger("chatflow_cli.core.mcp")
# the SDK logs a server's bad line with a traceback: an application that set up no logging
# does not get it on stderr through Python's last-resort handler (chatflow's error line says it)
logging.getLogger("mcp").addHandler(logging.NullHandler())

#: Lines of a stdio server's stderr quoted in an error.
STDERR_LINES = 5

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _reason(exc: BaseException) -> str:
    """What went wrong, in words (the first real error of an exception group)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        inner = [e for e in exc.exceptions if not isinstance(e, asyncio.CancelledError)]
        exc = (inner or list(exc.exceptions))[0]
    if isinstance(exc, FileNotFoundError):
        return f"its command was not found ({exc.filename or exc})"
    if isinstance(exc, PermissionError):
        return f"its command cannot be run ({exc})"
    if isinstance(exc, TimeoutError):
        return str(exc) or "it did not answer in time"
    code = getattr(exc, "code", None)
    if code == -32000:  # CONNECTION_CLOSED
        return "it exited, or closed the connection, before answering"
    message = str(getattr(exc, "message", None) or exc) or type(exc).__name__
    return f"{type(exc).__name__}: {message}"[:300]


#: Characters a Rich traceback draws its box with (and its pointer at the failing line).
_BOX = frozenset("│┃╭╮╰╯─━┏┓┗┛┌┐└┘├┤╶╴❱")


def _meaningful(lines: Iterable[str]) -> list[str]:
    """The lines of a server's stderr worth quoting, cut to 200 characters: no empty lines,
    no lines of a Rich traceback's box, no frames of a Python traceback (its exception line,
    which says what went wrong, stays)."""
    out: list[str] = []
    frames = False
    for raw in lines:
        line = raw.strip()
        if not line or line[0] in _BOX:
            continue
        if line.startswith("Traceback (most recent call last)"):
            frames = True
            continue
        if frames and raw[:1].isspace():  # '  File "x.py", line 3, in f' and its source line
            continue
        frames = False
        out.append(line[:200])
    return out


class MCPServer:
    """A tool server (use :class:`MCPServerStdio` or :class:`MCPServerStreamableHttp`).

    Args:
        params: the transport's parameters (see the subclass).
        name: the server's name: 1-64 letters, digits, ``_``, ``-`` or ``.``; its tools are
            offered as ``NAME__TOOL`` (:func:`~chatflow_cli.core.mcp.tools.tool_name`).
        timeout: seconds a call may take (:data:`DEFAULT_CALL_TIMEOUT_S`).
        start_timeout: seconds to start and list the tools (:data:`DEFAULT_START_TIMEOUT_S`).
        approval: the policy of its tools: ``"always"``, ``"ask"`` (default) or ``"never"``.
        tool_approval: ``{tool name: policy}`` overriding ``approval`` for some tools.
        tools: only these of its tools are offered (``None``: all).
        vaults: reads ``vault:`` references (a
            :class:`~chatflow_cli.core.resources.vaults.Vaults`, or a function making one).
        tools_cache: a directory where the tools it lists are kept between runs
            (:mod:`~chatflow_cli.core.mcp.cache`); None: none kept.
    """

    transport = ""

    def __init__(self, params: Mapping[str, Any], *, name: str, timeout: float = DEFAULT_CALL_TIMEOUT_S,
                 start_timeout: float = DEFAULT_START_TIMEOUT_S, approval: str = "ask",
                 tool_approval: Mapping[str, str] | None = None, tools: Iterable[str] | None = None,
                 vaults: Any = None, tools_cache: str | os.PathLike[str] | None = None) -> None:
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise UsageError(f"MCP server name {name!r}: use 1-64 letters, digits, '_', '-' or '.'")
        for policy in (approval, *(tool_approval or {}).values()):
            if policy not in APPROVAL_POLICIES:
                raise UsageError(f"MCP server {name!r}: approval {policy!r}: use always, ask or never")
        for seconds in (timeout, start_timeout):
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
                raise UsageError(f"MCP server {name!r}: a timeout is a number of seconds above 0, got {seconds!r}")
        self.params = dict(params)
        self.name = name
        self.timeout = float(timeout)
        self.start_timeout = float(start_timeout)
        self.approval = approval
        self.tool_approval = dict(tool_approval or {})
        self.tool_names: tuple[str, ...] | None = tuple(tools) if tools is not None else None
        self.vaults = vaults
        self.tools_cache = Path(tools_cache) if tools_cache is not None else None
        self._lock: asyncio.Lock | None = None
        self._session: Any = None
        self._listed: list[Any] = []
        self._has_listed = False  # it listed its tools in this process (``_listed`` holds them)
        self._listed_names: frozenset[str] = frozenset()
        self._kept: list[Any] | None = None  # the tools cache's list, read once
        self._kept_read = False
        self._failed = False  # its last start failed: what the cache says is not offered
        self._stop_event: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._errlog: Any = None
        self._noise = 0  # lines of its output that were not MCP messages (empty lines aside)
        self._noise_last = ""  # the last of them, cut
        self._http_status = ""  # an HTTP server's last error status not yet said ("401 Unauthorized")
        self._stderr_seen = 0  # bytes of its stderr written before the current call, or already quoted
        self._tools: dict[str, MCPTool] | None = None
        self._tools_of: list[Any] | None = None  # the list ``_tools`` was made of
        self._inflight: set[concurrent.futures.Future[Any]] = set()
        self._warned: set[tuple[str, str]] = set()  # unknown tool names said (unknown_tools_note)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"

    # -- what it is -------------------------------------------------------------------------
    @property
    def server(self) -> MCPServer:
        """The server itself (a :class:`MCPServerSelection` names the server it selects from)."""
        return self

    @property
    def running(self) -> bool:
        """Started and connected."""
        return self._session is not None

    def policy_for(self, tool: str) -> str:
        """The approval policy of the server's tool ``tool`` (its name on the server)."""
        return self.tool_approval.get(tool, self.approval)

    def only(self, *tools: str) -> MCPServerSelection:
        """This server offering only ``tools`` (its names on the server) to an agent."""
        return MCPServerSelection(self, tools)

    def describe(self) -> str:
        """How it is reached, without any secret: the command and arguments, or the URL."""
        raise NotImplementedError

    async def _open(self, stack: contextlib.AsyncExitStack) -> tuple[Any, Any]:
        raise NotImplementedError

    # -- the Agents SDK's async methods ---------------------------------------------------------
    async def connect(self) -> None:
        """Start the server (when it is not running) and list its tools. Raises MCPServerError."""
        await _loop.arun(self._ensure())

    async def list_tools(self) -> list[Any]:
        """The server's tools (``mcp.types.Tool``), starting it when needed."""
        return list(await _loop.arun(self._ensure()))

    async def call_tool(self, tool_name: str, arguments: dict[str, Any] | None) -> Any:
        """Call ``tool_name`` (its name on the server); the ``CallToolResult``. Raises MCPServerError."""
        return await _loop.arun(self._call(tool_name, arguments or {}))

    async def cleanup(self) -> None:
        """Stop the server (a no-op when it is not running)."""
        await _loop.arun(self._shutdown(self.start_timeout))

    # -- sync twins -----------------------------------------------------------------------------
    def start(self) -> None:
        """Sync twin of :meth:`connect`."""
        _loop.run(self._ensure())

    def list_tools_sync(self) -> list[Any]:
        """Sync twin of :meth:`list_tools`."""
        return list(_loop.run(self._ensure()))

    def call_tool_sync(self, tool_name: str, arguments: dict[str, Any] | None) -> Any:
        """Sync twin of :meth:`call_tool`; :meth:`cancel_calls` cancels it from another thread."""
        future = _loop.submit(self._call(tool_name, arguments or {}))
        self._inflight.add(future)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise MCPServerError(f"MCP server {self.name!r}: the call to {tool_name} was cancelled") from None
        finally:
            self._inflight.discard(future)

    def cancel_calls(self) -> None:
        """Cancel the calls running now (the server is told: ``notifications/cancelled``)."""
        for future in list(self._inflight):
            future.cancel()

    def stop(self, timeout: float = 5.0) -> None:
        """Sync twin of :meth:`cleanup`: the server's process is ended within about ``timeout`` s."""
        if self._task is None:
            return
        with contextlib.suppress(Exception):
            _loop.run(self._shutdown(timeout), timeout + 1)

    def known_tools(self) -> list[Any] | None:
        """The tools known without starting it: those it listed in this process, else those
        its tools cache kept (unless a start failed since); None when none are known."""
        if self._has_listed:
            return self._listed
        if self._failed or self.tools_cache is None:
            return None
        if not self._kept_read:
            from .cache import definition_key, load

            self._kept_read = True
            self._kept = load(self.tools_cache, definition_key(self.transport, self.params))
        return self._kept

    def agent_tools(self, *, start: bool = True) -> dict[str, MCPTool]:
        """The server's tools as chatflow tools, by the name offered to the model: those
        known (:meth:`known_tools`) without starting it; when none are known, the server is
        started (``start``, raising MCPServerError) to list them, or there are none."""
        known = self.known_tools()
        if known is None:
            if not start:
                return {}
            self.start()
            known = self._listed
        if self._tools is None or self._tools_of is not known:
            from .tools import tools_of

            self._tools, self._tools_of = tools_of(self, known), known
        if self.tool_names is None:
            return self._tools
        return {k: t for k, t in self._tools.items() if t.remote_name in self.tool_names}

    def stderr_tail(self, lines: int = STDERR_LINES, since: int = 0) -> str:
        """The last ``lines`` meaningful lines of a stdio server's stderr written after byte
        ``since``, scrubbed of secrets ('' when none): a traceback is said by its exception
        line, without its frames or the box a Rich traceback is drawn in."""
        errlog = self._errlog
        if errlog is None:
            return ""
        try:
            fd = errlog.fileno()
            size = os.fstat(fd).st_size
            start = max(since, size - 8192)
            data = os.pread(fd, size - start, start) if size > start else b""
        except (OSError, ValueError):
            return ""
        shown = _meaningful(data.decode("utf-8", "replace").splitlines())
        return scrub_values(" | ".join(shown[-lines:]))

    def _stderr_size(self) -> int:
        """How many bytes of stderr the stdio server has written (0: none, or not a stdio server)."""
        try:
            return os.fstat(self._errlog.fileno()).st_size if self._errlog is not None else 0
        except (OSError, ValueError):
            return 0

    def _fault(self, what: str) -> MCPServerError:
        extra = ""
        if self._http_status:  # said once, with the error it caused
            extra += f" (HTTP {self._http_status})"
            self._http_status = ""
        if self._noise:  # its stdout, said apart from its stderr, once
            lines = "1 line" if self._noise == 1 else f"{self._noise} lines"
            last = f" (the last: {self._noise_last!r})" if self._noise_last else ""
            extra += f"; it also printed {lines} of other text on stdout, which is for MCP messages only{last}"
            self._noise, self._noise_last = 0, ""
        tail = self.stderr_tail(since=self._stderr_seen)
        self._stderr_seen = self._stderr_size()  # quoted once: a later error quotes what came after
        if tail:
            extra += f"; its stderr ended with: {tail}"
        return MCPServerError(scrub_values(f"MCP server {self.name!r} {what}{extra}"))

    # -- on the MCP loop ------------------------------------------------------------------------
    async def _ensure(self) -> list[Any]:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._session is not None:
                return self._listed
            if self.transport == "sse":
                raise self._fault("uses the SSE transport, which chatflow does not support: use streamable HTTP")
            if self._task is not None:  # a connection that ended: let its owner finish
                await self._shutdown(self.start_timeout)
            self._noise, self._noise_last, self._http_status = 0, "", ""
            self._tools = None
            ready: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
            self._stop_event = asyncio.Event()
            self._task = asyncio.ensure_future(self._own(ready, self._stop_event))
            _loop.register(self)
            try:
                listed = await asyncio.shield(ready)
            except MCPServerError as exc:  # a reference that cannot be read
                self._failed = True
                raise self._fault(f"did not start: {exc}") from None
            except Exception as exc:
                self._failed = True
                raise self._fault(f"did not start: {_reason(exc)}") from None
            self._failed = False
            return listed

    async def _own(self, ready: asyncio.Future[list[Any]], stop: asyncio.Event) -> None:
        """The task owning the connection: open it, list the tools, wait for ``stop``."""
        import anyio
        from mcp import ClientSession

        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await self._open(stack)
                session = await stack.enter_async_context(
                    ClientSession(read, write, message_handler=self._on_message))
                try:
                    with anyio.fail_after(self.start_timeout):
                        await session.initialize()
                        listed = await _list_all(session)
                except TimeoutError:
                    raise TimeoutError(f"it did not answer within {self.start_timeout:g} s") from None
                self._session = session
                self._listed, self._listed_names = listed, frozenset(str(t.name) for t in listed)
                self._has_listed = True
                if self.tools_cache is not None:
                    from .cache import definition_key, save

                    save(self.tools_cache, definition_key(self.transport, self.params), listed)
                ready.set_result(listed)
                await stop.wait()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller waiting for the start
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(_reason(exc)))
            else:
                log.info("MCP server %s ended: %s", self.name, _reason(exc))
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self._session = None

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception):  # a line of its stdout that is no JSON-RPC message
            errors = getattr(message, "errors", None)
            try:
                line = errors()[0].get("input") if callable(errors) else None
            except Exception:  # noqa: BLE001 - not a pydantic error: count it, without its text
                line = None
            if isinstance(line, str) and not line.strip():
                return  # an empty line: nothing a reader would count
            self._noise += 1
            self._noise_last = scrub_values(line.strip())[:100] if isinstance(line, str) else ""
            log.warning("MCP server %s wrote something that is not an MCP message: %s", self.name,
                        scrub_values(str(message))[:200])

    async def _shutdown(self, timeout: float) -> None:
        task, stop = self._task, self._stop_event
        if task is None:
            return
        if stop is not None:
            stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout)
        except (TimeoutError, asyncio.TimeoutError):
            task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, 5)
        except BaseException:  # noqa: BLE001 - the owner's own failure was reported when it happened
            pass
        if self._task is task:
            self._task = None
        if self._errlog is not None:
            with contextlib.suppress(OSError):
                self._errlog.close()
            self._errlog = None

    async def _call(self, tool: str, arguments: dict[str, Any]) -> Any:
        from mcp import MCPError
        from pydantic import ValidationError

        await self._ensure()
        session = self._session
        if session is None:
            raise self._fault("is not running")
        if tool not in self._listed_names:
            raise self._fault(f"has no tool {tool!r} any more (its tools changed since they were listed; the next "
                              f"request offers those it has now: {', '.join(sorted(self._listed_names)) or 'none'})")
        self._stderr_seen = self._stderr_size()  # an error of this call quotes what it wrote, not older lines
        try:
            return await session.call_tool(tool, arguments, read_timeout_seconds=self.timeout)
        except MCPError as exc:
            if exc.code == -32001:  # REQUEST_TIMEOUT: the SDK sent notifications/cancelled
                raise self._fault(f"did not answer the call to {tool} within {self.timeout:g} s; the call was "
                                  "cancelled") from None
            if exc.code == -32000:  # CONNECTION_CLOSED
                await self._drop()
                raise self._fault(f"exited, or closed the connection, during the call to {tool}; it will be "
                                  "started again on the next call") from None
            raise self._fault(f"answered the call to {tool} with an error: {exc.message} (code {exc.code})") from None
        except (ValidationError, ValueError, RuntimeError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise self._fault(f"returned a malformed result for {tool}: {first[:200]}") from None

    async def _drop(self) -> None:
        """Close a connection that broke, keeping its stderr for the error line."""
        errlog, self._errlog = self._errlog, None
        await self._shutdown(5.0)
        self._errlog = errlog


async def _list_all(session: Any) -> list[Any]:
    """Every tool of the server, across pages (at most 100 pages)."""
    from mcp.types import PaginatedRequestParams

    tools: list[Any] = []
    cursor = None
    for _ in range(100):
        page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


class MCPServerStdio(MCPServer):
    """A server run as a child process, speaking MCP on its stdin and stdout.

    ``params``: ``{"command": str, "args": [str, ...], "env": {str: str}, "cwd": str}``
    (``env`` adds to the few variables the SDK passes on: ``HOME``, ``PATH``...). Its stderr
    goes to a private temporary file whose last lines errors quote.
    """

    transport = "stdio"

    def __init__(self, params: Mapping[str, Any], **options: Any) -> None:
        command = params.get("command")
        if not isinstance(command, str) or not command:
            raise UsageError("MCPServerStdio needs params={'command': ...}")
        super().__init__(params, **options)

    def describe(self) -> str:
        import shlex

        return shlex.join([self.params["command"], *map(str, self.params.get("args") or ())])

    async def _open(self, stack: contextlib.AsyncExitStack) -> tuple[Any, Any]:
        from mcp.client.stdio import StdioServerParameters, stdio_client

        from .refs import expand, resolve_all

        env = resolve_all(self.params.get("env") or {}, self.vaults, "env")
        command = expand(str(self.params["command"]), self.vaults, "command")
        args = [expand(str(a), self.vaults, f"args[{i}]") for i, a in enumerate(self.params.get("args") or ())]
        if self._errlog is not None:
            with contextlib.suppress(OSError):
                self._errlog.close()
        self._errlog = tempfile.TemporaryFile(mode="w+b")
        self._stderr_seen = 0
        errlog = os.fdopen(os.dup(self._errlog.fileno()), "w", encoding="utf-8", errors="replace")
        stack.callback(errlog.close)
        command, args = _kept(command, args, env, self.params.get("cwd"))
        parameters = StdioServerParameters(command=command, args=args, env=env or None, cwd=self.params.get("cwd"))
        streams: tuple[Any, Any] = await stack.enter_async_context(stdio_client(parameters, errlog=errlog))
        return streams


def _kept(command: str, args: list[str], env: Mapping[str, str], cwd: str | None) -> tuple[str, list[str]]:
    """The command line that runs a stdio server through its keeper (:mod:`._keeper`: on
    Linux, the server and what it starts end when chatflow dies, even by SIGKILL); elsewhere
    the command as it is. The command is looked up here, as the SDK would have: a missing one
    is a start failure saying so. Raises FileNotFoundError, PermissionError."""
    import shutil
    import sys

    if not sys.platform.startswith("linux") or not sys.executable or not os.path.isfile(sys.executable):
        return command, args
    if os.sep in command:  # relative to the server's directory, as exec takes it there
        full = os.path.join(cwd or os.getcwd(), command)
        if not os.path.exists(full):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command)
        if os.path.isdir(full) or not os.access(full, os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), command)
        found = command
    else:
        path = env.get("PATH", os.environ.get("PATH", os.defpath))
        found = shutil.which(command, path=path) or ""
        if not found:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command)
    keeper = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_keeper.py")
    return sys.executable, ["-I", "-S", keeper, str(os.getpid()), found, *args]


class MCPServerStreamableHttp(MCPServer):
    """A server reached over streamable HTTP.

    ``params``: ``{"url": str, "headers": {str: str}}``; headers may hold secret references.
    """

    transport = "http"

    def __init__(self, params: Mapping[str, Any], **options: Any) -> None:
        url = params.get("url")
        if not isinstance(url, str) or not re.match(r"^(https?://|\$\{)", url):
            raise UsageError("MCPServerStreamableHttp needs params={'url': 'http(s)://...'}")
        super().__init__(params, **options)

    def describe(self) -> str:
        url = str(self.params["url"])
        return re.sub(r"^(https?://)[^/@]*@", r"\1", url).split("?")[0].split("#")[0]

    async def _open(self, stack: contextlib.AsyncExitStack) -> tuple[Any, Any]:
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        from .refs import expand, resolve_all

        headers = resolve_all(self.params.get("headers") or {}, self.vaults, "headers")
        url = expand(str(self.params["url"]), self.vaults, "url")
        if not re.match(r"^https?://", url):
            raise MCPServerError("url: its value is not an http:// or https:// URL")
        async def note_status(response: Any) -> None:  # the SDK's error for it does not name the status
            if response.request.method == "POST":  # a message; a GET or DELETE the server need not support
                failed = response.status_code >= 400
                self._http_status = f"{response.status_code} {response.reason_phrase}".strip() if failed else ""

        client = await stack.enter_async_context(
            httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(self.start_timeout, read=300.0),
                               event_hooks={"response": [note_status]}))
        read, write = await stack.enter_async_context(streamable_http_client(url, http_client=client))
        return read, write


class MCPServerSelection:
    """Some tools of a server, for one agent: ``server.only("git_log", "git_diff")``."""

    def __init__(self, server: MCPServer, tools: Iterable[str]) -> None:
        self.server = server
        self.tool_names = tuple(tools)
        self.name = server.name

    def __repr__(self) -> str:
        return f"{self.server!r}.only{self.tool_names!r}"

    def known_tools(self) -> list[Any] | None:
        return self.server.known_tools()

    def agent_tools(self, *, start: bool = True) -> dict[str, MCPTool]:
        return {k: t for k, t in self.server.agent_tools(start=start).items() if t.remote_name in self.tool_names}


def unknown_tools_note(entry: Any, *, once: bool = True) -> str | None:
    """A warning naming the tools that ``entry`` (a started server, or a selection of one)
    names in ``tools``, ``tool_approval`` or ``only(...)`` but does not list (a misspelt
    ``never`` rule protects nothing); None when there are none, or (``once``) when this
    server object said them already."""
    server = entry.server
    named = [(t, "tools") for t in server.tool_names or ()] + [(t, "tool_approval") for t in server.tool_approval]
    if entry is not server:
        named += [(t, "the agent's tools") for t in entry.tool_names]
    listed = {str(t.name) for t in server.known_tools() or ()}
    unknown = [(t, where) for t, where in dict.fromkeys(named) if t not in listed]
    if once:
        unknown = [(t, where) for t, where in unknown if (t, where) not in server._warned]
        server._warned.update(unknown)
    if not unknown:
        return None
    names = ", ".join(f"{t!r} (in {where})" for t, where in unknown)
    return scrub_values(f"MCP server {server.name!r} has no tool {names}: check the spelling; its tools are "
                        f"{', '.join(sorted(listed)) or 'none'}")[:1000]


def stop_all(servers: Iterable[Any], timeout: float = 5.0) -> None:
    """Stop ``servers`` (servers or selections; those not running are skipped) all at once,
    each within about ``timeout`` s."""
    _loop.stop_all(list({id(s.server): s.server for s in servers}.values()), timeout)


def start_all(servers: Iterable[Any], *, skip: Callable[[str], bool] = lambda name: False) -> dict[str, str]:
    """Start ``servers`` (servers or selections) at once, in parallel; ``{name: error}`` of
    those that failed (those ``skip`` names are not tried)."""
    wanted = {s.server.name: s.server for s in servers if not s.server.running and not skip(s.server.name)}
    if not wanted:
        return {}

    async def all_of() -> list[Any]:
        return await asyncio.gather(*(s._ensure() for s in wanted.values()), return_exceptions=True)

    outcomes = _loop.run(all_of())
    return {name: str(out) if isinstance(out, MCPServerError) else f"MCP server {name!r} did not start: {_reason(out)}"
            for name, out in zip(wanted, outcomes) if isinstance(out, BaseException)}
