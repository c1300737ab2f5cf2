"""``chatflow memory ...``: read, fix and move memory stores (collections of documents that
sessions mount; see :mod:`chatflow_cli.core.resources`).

Each command opens the store, calls one library method and prints the result: text for a
person (control characters made inert), ``--json`` for scripts. Writes made here are
recorded as made outside a session. ``export`` writes JSON lines (a header, then one
document a line) that ``import`` reads back; an import writes the documents whose text
differs, each as a new version.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..context import confirm, notice, read_stdin_text
from ..core.errors import ChatflowError, MemoryStoreNotFoundError, UsageError
from ..core.resources.documents import check_path
from ..core.resources.mounts import check_resource_name
from ..render import dumps, format_age, plural, safe_text

if TYPE_CHECKING:  # pragma: no cover
    from ..context import State
    from ..core.memory import BaseSessionStore
    from ..core.resources.documents import DocumentVersion

__all__ = ["EXPORT_FORMAT", "EXPORT_VERSIONS", "create_store", "delete", "export_store", "history", "import_store",
           "list_memory", "parse_writes", "revert", "search", "show", "write"]

#: The ``format`` of an export's first line.
EXPORT_FORMAT = "chatflow-memory"
#: The export format ``version`` numbers ``import`` reads (``export`` writes the last).
EXPORT_VERSIONS = (1,)


def _store(state: State, name: str, *, create: bool = False) -> BaseSessionStore:
    check_resource_name(name)
    store = state.store(create=create)
    if store is None:
        from ..core.resources.secrets import NOT_SHOWN, quoted_name

        if quoted_name(name) == NOT_SHOWN:
            raise MemoryStoreNotFoundError(f"no memory store {NOT_SHOWN} (there is no database yet)", name=name)
        raise MemoryStoreNotFoundError(
            f"memory store {name!r} does not exist (there is no database yet; chatflow memory create {name} makes it)",
            name=name)
    return store


def _emit(state: State, data: Any, output: str) -> None:
    if output == "jsonl" and isinstance(data, list):
        state.env.stdout.write("".join(dumps(row) + "\n" for row in data))
    else:
        state.env.stdout.write(dumps(data, indent=2) + "\n")


def create_store(state: State, name: str, *, description: str, output: str) -> None:
    """``memory create NAME``: a new, empty memory store. UsageError if it exists."""
    info = _store(state, name, create=True).create_memory_store(name, description=description)
    if output != "text":
        _emit(state, info.to_dict(), output)
        return
    notice(state, f"created memory store {name}: chatflow chat --memory {name} mounts it")


def list_memory(state: State, name: str | None, folder: str, *, output: str) -> None:
    """``memory ls``: every store; ``memory ls NAME [FOLDER]``: its documents."""
    if name is None:
        store = state.store(create=False)
        stores = [] if store is None else store.memory_stores()
        if output != "text":
            _emit(state, [s.to_dict() for s in stores], output)
            return
        if not stores:
            notice(state, "no memory stores (chatflow memory create NAME makes one)")
            return
        width = max(len(s.name) for s in stores)
        for s in stores:
            state.env.stdout.write(
                f"{s.name:<{width}}  {plural(s.documents, 'document'):>12}  {s.size_bytes:>9} B  "
                f"{plural(s.last_seq, 'write'):>10}  {safe_text(s.description, one_line=True)}\n")
        return
    docs = _store(state, name).list_documents(name, folder)
    if output != "text":
        _emit(state, [d.to_dict() for d in docs], output)
        return
    if not docs:
        notice(state, f"memory store {name} has no documents" + (f" under {folder}" if folder else ""))
        return
    now = time.time()
    for d in docs:
        state.env.stdout.write(f"{d.size_bytes:>9} B  v{d.version:<5} {format_age(d.updated_at, now):>9}  "
                               f"{safe_text(d.path, one_line=True)}\n")


def show(state: State, name: str, path: str, *, version: int | None, output: str) -> None:
    """``memory show NAME PATH``: the document's text (``--version N``: as write N left it)."""
    store = _store(state, name)
    if version is None:
        doc = store.read_document(name, path)
        data = doc.to_dict()
    else:
        found = _version_of(store, name, path, version)
        data = {"store": name, "path": found.path, "text": found.text, "version": version,
                "updated_at": found.created_at}
    if output != "text":
        _emit(state, data, output)
        return
    text = safe_text(data["text"])
    state.env.stdout.write(text if text.endswith("\n") or not text else text + "\n")


def _version_of(store: BaseSessionStore, name: str, path: str, version: int) -> DocumentVersion:
    """Write ``version`` of the store, when it left text at ``path``; else a UsageError that
    says what is wrong: no such write, a write of another document, a delete, a move away."""
    path = check_path(path)
    found = store.memory_history(name, after_seq=version - 1, limit=1) if version >= 1 else []
    if not found or found[0].seq != version:
        latest = store.memory_store(name).last_seq
        raise UsageError(f"memory store {name!r} has no version {version} "
                         + (f"(latest is {latest}; chatflow memory history {name})" if latest
                            else "(it has no writes yet)"))
    v = found[0]
    shown = safe_text(path, one_line=True)
    if v.previous_path == path:
        raise UsageError(f"version {version} of memory store {name!r} moved {shown} to "
                         f"{safe_text(v.path, one_line=True)}: show that path at version {version}")
    if v.path != path:
        raise UsageError(f"version {version} of memory store {name!r} changed {safe_text(v.path, one_line=True)}, "
                         f"not this document ({shown}; chatflow memory history {name} {shown} lists its versions)")
    if v.text is None:
        raise UsageError(f"version {version} of memory store {name!r} deleted {shown}: it left no text "
                         f"(chatflow memory history {name} {shown} lists its versions)")
    return v


def _version_line(v: DocumentVersion, now: float) -> str:
    what = v.op + (f" of {v.reverts}" if v.reverts else "")
    where = v.path if v.previous_path is None else f"{v.previous_path} -> {v.path}"
    return (f"{v.seq:>5}  {format_age(v.created_at, now):>9}  {what:<14} {safe_text(where, one_line=True)}  "
            f"({safe_text(v.author.describe(), one_line=True)})\n")


def history(state: State, name: str, path: str | None, *, limit: int | None, output: str) -> None:
    """``memory history NAME [PATH]``: every write, oldest first, with who made it."""
    versions = _store(state, name).memory_history(name, path)
    if limit:
        versions = versions[-limit:]
    if output != "text":
        _emit(state, [v.to_dict() for v in versions], output)
        return
    if not versions:
        notice(state, f"memory store {name} has no writes" + (f" of {path}" if path else ""))
        return
    now = time.time()
    state.env.stdout.write("".join(_version_line(v, now) for v in versions))


def parse_writes(texts: list[str]) -> list[int]:
    """The write numbers of ``memory revert``'s arguments: ``N`` or a range ``N-M`` (both
    included), each a positive int. Raises UsageError for anything else."""
    out: list[int] = []
    for text in texts:
        first, dash, last = text.strip().partition("-")
        try:
            low = int(first)
            high = int(last) if dash else low
        except ValueError:
            raise UsageError(f"{text!r} is not a write number: give N or a range N-M (see chatflow memory history)") \
                from None
        if low < 1 or high < low:
            raise UsageError(f"{text!r} is not a write number: give N or a range N-M with 1 <= N <= M")
        if high - low >= 10_000:
            raise UsageError(f"{text!r} is more than 10,000 writes: revert fewer at once")
        out += range(low, high + 1)
    return out


def revert(state: State, name: str, writes: list[str], *, force: bool, output: str) -> None:
    """``memory revert NAME N [N-M ...]``: undo those writes with new writes, in one
    transaction (all or none), newest first."""
    seqs = parse_writes(writes)
    store = _store(state, name)
    if len(writes) == 1 and "-" not in writes[0]:
        done = [store.revert_memory(name, seqs[0], force=force)]
    else:
        done = store.revert_writes(name, seqs, force=force)
    if output != "text":
        _emit(state, done[0].to_dict() if len(writes) == 1 and "-" not in writes[0] else
              [v.to_dict() for v in done], output)
        return
    for v in done:
        moved = "" if v.previous_path is None else f" (moved back from {safe_text(v.previous_path, one_line=True)})"
        notice(state, f"reverted write {v.reverts} of {name} as write {v.seq}: {safe_text(v.path, one_line=True)} "
                      + ("deleted" if v.text is None else "restored") + moved)


def write(state: State, name: str, path: str, *, expected_version: int | None, output: str) -> None:
    """``memory write NAME PATH < FILE``: the document's whole text from stdin."""
    text = read_stdin_text(state, what="document")
    v = _store(state, name).write_document(name, path, text, expected_version=expected_version)
    if output != "text":
        _emit(state, v.to_dict(), output)
        return
    notice(state, f"wrote {name}/{safe_text(v.path, one_line=True)} (write {v.seq})")


def delete(state: State, name: str, path: str | None, *, yes: bool) -> None:
    """``memory rm NAME PATH``: delete a document (or a folder's); ``memory rm NAME``: the
    whole store with its history (asked first on a terminal)."""
    store = _store(state, name)
    if path is not None:
        done = store.delete_document(name, path, recursive=True)
        if len(done) == 1:
            notice(state, f"deleted 1 document of {name} (chatflow memory revert {name} {done[0].seq} "
                          f"brings {safe_text(done[0].path, one_line=True)} back)")
        else:  # one write a document, numbered one after another in one transaction
            notice(state, f"deleted {len(done)} documents of {name} (chatflow memory revert {name} "
                          f"{done[0].seq}-{done[-1].seq} brings them all back)")
        return
    info = store.memory_store(name)
    question = (f"Delete memory store {name} with its {plural(info.documents, 'document')} and "
                f"{plural(info.last_seq, 'write')} of history? This cannot be undone.")
    if not confirm(state, question, assume_yes=yes):
        notice(state, "nothing deleted")
        return
    store.delete_memory_store(name)
    notice(state, f"deleted memory store {name}")


def export_store(state: State, name: str, *, output_file: str | None) -> None:
    """``memory export NAME [-o FILE]``: a header line, then one document a line (JSON)."""
    store = _store(state, name)
    info = store.memory_store(name)
    docs = store.read_documents(name)
    lines = [dumps({"format": EXPORT_FORMAT, "version": EXPORT_VERSIONS[-1], "store": name,
                    "description": info.description, "last_seq": info.last_seq})]
    lines += [dumps({"path": d.path, "text": d.text, "version": d.version}) for d in docs]
    text = "".join(line + "\n" for line in lines)
    if output_file is None or output_file == "-":
        state.env.stdout.write(text)
    else:
        target = Path(output_file)
        if target.is_dir():
            raise UsageError(f"cannot write {output_file}: it is a directory (give a file name for the export)")
        partial = target.with_name(f".{target.name}.partial")
        try:
            partial.write_text(text, encoding="utf-8")
            partial.replace(target)
        except OSError as exc:
            partial.unlink(missing_ok=True)
            raise ChatflowError(f"cannot write {output_file}: {exc.strerror or exc}") from None
    notice(state, f"exported {plural(len(docs), 'document')} of memory store {name}")


def _read_export(state: State, source: str) -> tuple[dict[str, Any], dict[str, str]]:
    if source == "-":
        raw = read_stdin_text(state, what="memory export")
    else:
        try:
            raw = Path(source).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise UsageError(f"cannot read {source}: no such file") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read {source}: {exc}") from None
    header: dict[str, Any] | None = None
    docs: dict[str, str] = {}
    lines_of: dict[str, int] = {}
    for number, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{source} line {number}: not JSON ({exc.msg})") from None
        if header is None:
            if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
                raise UsageError(f"{source} line {number}: not a chatflow memory export "
                                 f"(chatflow memory export NAME writes one)")
            version = data.get("version")
            if version not in EXPORT_VERSIONS or isinstance(version, bool):
                raise UsageError(f"{source} line {number}: memory export format version {version!r} is not one this "
                                 f"chatflow reads (it reads version "
                                 f"{', '.join(map(str, EXPORT_VERSIONS))}; a newer chatflow may have written it)")
            header = data
        elif not isinstance(data, dict) or not isinstance(data.get("path"), str) \
                or not isinstance(data.get("text"), str):
            raise UsageError(f"{source} line {number}: a document is {{\"path\": ..., \"text\": ...}}")
        else:
            try:
                path = check_path(data["path"])
            except UsageError as exc:
                raise UsageError(f"{source} line {number}: {exc.message}") from None
            if path in docs:
                raise UsageError(f"{source} line {number}: the path {path!r} is there twice (first on line "
                                 f"{lines_of[path]}): nothing was imported")
            docs[path] = data["text"]
            lines_of[path] = number
    if header is None:
        raise UsageError(f"{source} is empty: not a chatflow memory export")
    return header, docs


def import_store(state: State, source: str, *, into: str | None, output: str) -> None:
    """``memory import FILE [--into NAME]``: the store is created if missing; documents whose
    text differs are written (one version each, op ``import``)."""
    header, docs = _read_export(state, source)
    name = into or str(header.get("store") or "")
    check_resource_name(name)
    store = _store(state, name, create=True)
    # the store is made in the import's one transaction: a refused document leaves nothing behind
    written = store.write_documents(name, docs, create=True, description=str(header.get("description") or ""))
    if output != "text":
        _emit(state, [v.to_dict() for v in written], output)
        return
    notice(state, f"imported {plural(len(written), 'document')} into memory store {name} "
                  f"({len(docs) - len(written)} unchanged)")


def search(state: State, query: str, *, stores: list[str] | None, limit: int, output: str) -> None:
    """``memory search QUERY``: documents matching the query (the session search's language)."""
    from ..core.memory.search import parse_query, plain_snippet

    parse_query(query)
    for name in stores or []:
        check_resource_name(name)
    store = state.store(create=False)
    if store is None:
        if stores:
            _store(state, stores[0])
        hits = []
    else:
        hits = store.search_memory(query, stores=stores or None, limit=limit)
    if output != "text":
        _emit(state, [h.to_dict() for h in hits], output)
        return
    if not hits:
        notice(state, f"no memory document matches {query!r}")
        return
    for h in hits:
        snippet = plain_snippet(h.snippet).replace("\n", " ")
        state.env.stdout.write(f"{h.store}/{safe_text(h.path, one_line=True)}  (version {h.version})\n"
                               f"  {safe_text(snippet, one_line=True)}\n")
