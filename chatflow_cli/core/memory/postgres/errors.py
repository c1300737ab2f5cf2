"""How a ``psycopg`` error becomes one :class:`StoreError` line: unreachable, lost connection
(and whether a commit may have landed), retryable rollbacks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...dsn import redact_dsn
from ...errors import StoreError, StoreUnreachableError

if TYPE_CHECKING:
    import psycopg

#: SQLSTATEs of a transaction PostgreSQL rolled back and says may simply run again:
#: serialization_failure and deadlock_detected.
_RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})
#: Attempts of a write whose transaction PostgreSQL rolled back as retryable.
_WRITE_ATTEMPTS = 4


def _store_error(exc: BaseException, label: str, *, committing: bool = False, broken: bool = False) -> StoreError:
    """One clear line for a psycopg error on database ``label`` (never a password).

    ``committing``: the error came once the COMMIT was sent. An error the server reported
    (it has a SQLSTATE) rolled the transaction back; a lost connection then leaves the
    commit's outcome unknown, and the error says the write may have happened
    (``written=None``); before the COMMIT, nothing of it was written (``written=False``).

    ``broken``: the connection the error came on turned out lost (psycopg's
    ``conn.broken`` / ``conn.closed`` after the error). Whatever the error says -- psycopg's
    own "cannot exit pipeline mode while busy" on a terminated connection, say -- it is then
    a :class:`StoreUnreachableError`, as is an error whose SQLSTATE -- or that of an error
    it was raised while handling -- says the connection ended (class 08, connection
    exception; 57P, the server shut the session down).
    """
    import psycopg

    cause = _connection_ended(exc)
    if cause is not None and cause is not exc:  # say the server's reason, not what psycopg met next
        exc = cause
    text = redact_dsn(" ".join(str(exc).split()))
    low = text.lower()
    sqlstate = getattr(exc, "sqlstate", None) or ""
    retryable = sqlstate in _RETRYABLE_SQLSTATES
    lost = broken or cause is not None
    # the COMMIT was sent and no answer of the server says it was rolled back
    unknown = committing and (not sqlstate or lost)
    unreachable = False
    if (isinstance(exc, psycopg.OperationalError) or isinstance(exc, psycopg.InterfaceError)) and not broken and (
            "authentication" in low or "no password supplied" in low):
        message = f"cannot connect to {label}: authentication failed ({text})"
    elif (isinstance(exc, psycopg.OperationalError) or isinstance(exc, psycopg.InterfaceError)) and not broken and (
            "does not exist" in low):
        message = f"cannot connect to {label}: {text}"
    elif (isinstance(exc, psycopg.OperationalError) or isinstance(exc, psycopg.InterfaceError)) and not broken and (
            "connection refused" in low or "could not connect" in low or "connection failed" in low):
        # StoreUnreachableError: the server may come back (a restart); a follower retries
        message, unreachable = f"cannot connect to {label}: {text}", True
    elif unknown and (lost or isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError))):
        message, unreachable = (f"lost the connection to {label} once the commit was sent ({text}); the write "
                                "may have been committed or not: read the session again to know"), True
    elif lost or (isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)) and (
            "closed" in low or "terminat" in low or "lost" in low or "eof" in low)):
        message, unreachable = (f"lost the connection to {label} ({text}); the transaction was rolled back, "
                                "nothing of it was written"), True
    elif unknown:
        message = (f"database error on {label} while committing ({text}); the write may have been committed "
                   "or not: read the session again to know")
    elif isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)) and not retryable:
        message = f"database error on {label}: {text}; nothing of it was written"
    else:
        message = f"database error on {label}: {text}; the transaction was rolled back, nothing of it was written"
    kind = StoreUnreachableError if unreachable else StoreError
    return kind(message, written=None if unknown else False, retryable=retryable)


#: SQLSTATE classes of a session the server ended or lost: connection exception (08) and
#: the server shutting the session down (57P: admin_shutdown, crash_shutdown, cannot_connect_now).
_LOST_SQLSTATES = ("08", "57P")


def _connection_ended(exc: BaseException) -> BaseException | None:
    """The error of ``exc``'s chain (itself, or what it was raised while handling) whose
    SQLSTATE says the server ended the connection, or None. psycopg raises "cannot exit
    pipeline mode while busy" while handling the server's "terminating connection due to
    administrator command", before the connection itself is seen closed."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if str(getattr(current, "sqlstate", None) or "").startswith(_LOST_SQLSTATES):
            return current
        current = current.__cause__ or current.__context__
    return None


def _lost(conn: psycopg.Connection[Any]) -> bool:
    """The connection turned out lost: the server ended it, or it was closed."""
    return bool(conn.broken or conn.closed)
