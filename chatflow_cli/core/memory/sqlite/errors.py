"""How a ``sqlite3`` or OS error becomes one :class:`StoreError` line, and the busy timeout
every connection waits on a lock before the lock is such an error."""

from __future__ import annotations

from ...errors import StoreError

#: Seconds every connection waits on another writer's lock (``sqlite3.connect(timeout=)`` and
#: ``PRAGMA busy_timeout``) before "database is locked".
_BUSY_TIMEOUT_S = 30.0


def _store_error(exc: BaseException, where: str) -> StoreError:
    """One clear line for a sqlite3 / OS error on database ``where``."""
    text = str(exc)
    low = text.lower()
    if "file is not a database" in low or "file is encrypted" in low:
        message = f"{where} is not a SQLite database"
    elif "malformed json" in low:  # SQLite's JSON functions on one stored value, not the file
        message = (f"{where}: a stored value is not strict JSON ({text}; e.g. a NaN or Infinity written by "
                   "an older chatflow): the file itself is not corrupt")
    elif "malformed" in low or "corrupt" in low:
        message = f"{where} is corrupt or truncated ({text})"
    elif "readonly" in low or "read-only" in low or isinstance(exc, PermissionError):
        message = f"{where} cannot be written: read-only file or directory ({text})"
    elif "disk is full" in low or "database or disk is full" in low:
        message = f"{where} cannot be written: the disk is full"
    elif "unable to open" in low:
        message = f"cannot open {where}: missing directory, permissions, or read-only location ({text})"
    elif "locked" in low or "busy" in low:
        message = f"{where} is locked by another process (waited {_BUSY_TIMEOUT_S:.0f} s)"
    elif isinstance(exc, OSError):
        message = f"cannot open {where}: {exc.strerror or text}"
    else:
        message = f"database error on {where}: {text}"
    return StoreError(message)
