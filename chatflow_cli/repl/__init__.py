"""The interactive REPL: ``chatflow`` or ``chatflow chat`` with no message, on a terminal.

Entry point, called lazily by the CLI (prompt-toolkit is imported only here)::

    run_repl(state, *, session_id=None, continue_last=False, model=None, agent=None,
             base_url=None, max_turns=None, system=None, input=None, output=None,
             console=None) -> int

``state`` is the run's :class:`chatflow_cli.context.State` (settings, store, consoles).
``session_id`` continues (or creates) that session; ``continue_last`` picks the most
recently updated one; otherwise a new session id is made. ``model``/``agent``/``base_url``
are the ``--model``/``--agent``/``--base-url`` flags. ``input``/``output`` are
prompt-toolkit ``Input``/``Output`` objects (tests pass ``create_pipe_input()`` and
``DummyOutput()``); ``console`` is the Rich console replies are rendered on (default: the
CLI's stdout console). Returns the exit status (0). Configuration problems raise the
chatflow errors the CLI's error boundary reports; nothing that happens in a turn ends the
REPL.

Keys:

=====================  ============================================================
Enter                  send the message (in a Ctrl-R search: take the match and send it)
Esc Enter / Alt-Enter  a new line in the message
paste                  a bracketed paste is inserted as it is (one message, CRLF
                       made LF), and sent only on Enter
Ctrl-X Ctrl-E, /edit   write the message in ``$VISUAL`` / ``$EDITOR``; the text comes back
                       to the prompt for review and Enter sends it
Up / Down, Ctrl-R      history (kept in ``<data dir>/repl_history``, mode 0600), search
Right arrow            accept the grey suggestion taken from history
Tab                    complete a slash command, a session id, an agent name
Ctrl-C                 at the prompt: clear it; while a reply streams or a tool runs:
                       stop the turn (stored as interrupted) and come back here
Ctrl-D                 at an empty prompt: leave
=====================  ============================================================

Slash commands: ``/help``, ``/new``, ``/sessions``, ``/switch ID``, ``/show [--full]``,
``/rollback [N]`` (keep turns 1..N as ``/show`` numbers them; default: drop the last
turn; asks first), ``/retry`` (send the last failed message again, also after reopening
the session: it is in the event log; when nothing failed it says so and offers, asking
first, to roll back the last turn for another answer), ``/agent [NAME]``,
``/model [NAME]``, ``/metadata [KEY=VALUE]``, ``/edit``, ``/clear`` (the screen only),
``/exit``. ``/switch ID`` talks to ID's stored model and endpoint, as
``chatflow chat -s ID`` does (the session being left keeps its own), and ``/new`` goes
back to the ones from the flags or config; a change is announced (``model: M (session
ID)``). An unknown command gets a suggestion when one is close (difflib ratio 0.75),
and never reaches the model; a message that really starts with ``/`` is sent by typing
``//`` first. Blank or whitespace-only input is neither sent nor kept in the history.

While a turn runs: a spinner until the first token; the reply streams as Markdown
(:class:`~chatflow_cli.render.markdown_stream.MarkdownStream`: finished blocks printed once,
only the tail redrawn); tool calls print as they start and finish (arguments and results
folded when long); a handoff prints ``handoff: A -> B`` and the prompt then shows the new
agent. A custom tool (config ``tools = [{name, description, parameters}]``) asks here for
its result — JSON or plain text — and the turn continues. A provider error prints one
line and keeps the message for ``/retry``.

The bottom toolbar shows the session id, active agent, model, turn number, context
window use (turns in the window of ``max_turns``) and the tokens of the last turn.

How a turn runs: the Runner's ``run_streamed`` generator is consumed on a worker thread
(it blocks on the network and on tools); its events come to the asyncio loop through a
queue. Meanwhile the terminal is in raw mode and its keys are read, so Ctrl-C arrives as
a key (SIGINT is handled too) and sets the Runner's cancel event; the Runner stores the
turn as interrupted and the REPL returns to the prompt. Keys typed during a turn are
type-ahead, as in a shell: kept in order and acted on by the next prompt as if typed
there (a line typed and entered during a reply is sent when the turn ends; Ctrl-D
leaves); Ctrl-C discards the type-ahead typed before it.
Closing the terminal (SIGHUP) during a turn stops it as Ctrl-C does — the Runner stores
it as interrupted with the partial reply — and then the REPL leaves (exit 129, as a one-shot
``chat`` hung up).
"""

from __future__ import annotations

from .app import HISTORY_FILENAME, Repl, run_repl
from .commands import COMMANDS, slash_completions
from .turn import ABANDON_AFTER_S

__all__ = ["ABANDON_AFTER_S", "COMMANDS", "HISTORY_FILENAME", "Repl", "run_repl", "slash_completions"]
