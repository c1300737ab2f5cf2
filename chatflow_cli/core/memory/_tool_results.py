"""Tool results submitted for a turn that waits on them."""

from __future__ import annotations


from collections.abc import Sequence

from ..attachments import Attachment
from ..errors import ToolResultError
from ..events import EventType
from ._checks import _check_session_id
from ._core import _StoreCore
from ._port import _Tx
from ._twins import async_twin


class _ToolResults(_StoreCore):
    """Tool results submitted from outside a running turn."""

    def _submitted(self, tx: _Tx, session_id: str) -> dict[str, tuple[str, bool, tuple[Attachment, ...]]]:
        """tool_use_id -> (output, is_error, attachments) submitted since the last MODEL message.

        ``is_error`` comes from the payload's optional ``"is_error": true``, which the Runner
        sets for a regular tool's error result recorded beside custom calls; ``attachments``
        from its optional ``"attachments"`` (the metadata of the images the tool returned,
        their bytes stored with the event).
        """
        model = tx.last_event(session_id, EventType.MESSAGE_MODEL.value)
        after = model.seq if model is not None else 0
        return {
            str(e.payload["tool_use_id"]): (str(e.payload.get("output", "")), e.payload.get("is_error") is True,
                                            _attached(e.payload.get("attachments")))
            for e in tx.events_of_type(session_id, EventType.TOOL_RESULT_SUBMITTED.value, after)
        }

    def submitted_tool_results(self, session_id: str) -> dict[str, str]:
        """The results already submitted for the open turn's pending tool calls, by tool-call id
        (``{tool_use_id: output}``): a turn waiting on several custom tools keeps them until
        every call has its result, then continues. Empty when nothing is waiting.

        Raises:
            SessionNotFoundError: no such session.
        """
        _check_session_id(session_id)
        with self._read() as tx:
            row = self._require(tx, session_id)
            submitted = self._submitted(tx, session_id)
            if not submitted:  # the common case: no window to load
                return {}
            pending = {c.id for c in self._context(tx, row, quiet=True).pending_tool_calls}
            return {i: output for i, (output, _, _) in submitted.items() if i in pending}

    def submit_tool_result(self, session_id: str, tool_use_id: str, output: str, *, is_error: bool = False,
                           attachments: Sequence[Attachment] = ()) -> list[str]:
        """Record a custom tool's result (``tool.result_submitted``); return the ids still unanswered.

        ``is_error``: the result is an error result (``"is_error": true`` in the payload; the
        TOOL message stored when the turn continues is flagged), as for a tool call waiting for
        an approval that was denied, or that failed once approved. ``attachments``: the images
        the tool returned (their metadata in the payload's ``"attachments"``, their bytes
        stored once by hash in the same transaction; the TOOL message carries them).

        An id that is not pending, or was already answered: :class:`ToolResultError`, nothing written.

        Raises:
            ToolResultError: ``tool_use_id`` is not pending, or already has a result.
            SessionNotFoundError: no such session.
            SessionTerminatedError: the session is terminated.
        """
        _check_session_id(session_id)
        with self._write() as tx:
            row = self._require(tx, session_id)
            self._refuse_terminated(row)
            ctx = self._context(tx, row, quiet=True)
            pending = [c.id for c in ctx.pending_tool_calls]
            submitted = self._submitted(tx, session_id)
            if tool_use_id not in pending:
                raise ToolResultError(
                    f"no pending tool call {tool_use_id!r} in session {session_id}", session_id=session_id
                )
            if tool_use_id in submitted:
                raise ToolResultError(f"tool call {tool_use_id!r} already has a result", session_id=session_id)
            payload: dict[str, object] = {"turn": ctx.turn_count, "tool_use_id": tool_use_id, "output": str(output)}
            if is_error:
                payload["is_error"] = True
            if attachments:
                payload["attachments"] = [a.to_dict() for a in attachments]
            self._append(tx, session_id, EventType.TOOL_RESULT_SUBMITTED.value, payload, ctx.turn_count)
            if attachments:
                tx.attachments_add(session_id, attachments)  # type: ignore[attr-defined]
            row.updated_at = self.clock()
            tx.update_row(row)
            return [i for i in pending if i != tool_use_id and i not in submitted]

    asubmit_tool_result = async_twin(submit_tool_result, writes=True)


def _attached(raw: object) -> tuple[Attachment, ...]:
    """The attachments a ``tool.result_submitted`` payload names (none when it names none, or
    not as a list of attachment objects)."""
    if not isinstance(raw, list):
        return ()
    try:
        return tuple(Attachment.from_dict(item) for item in raw)
    except ValueError:
        return ()
