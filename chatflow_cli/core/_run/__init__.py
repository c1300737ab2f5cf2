"""The machinery behind :class:`~chatflow_cli.core.runner.Runner`, one room per concern.

:mod:`chatflow_cli.core.runner` is the public face (``Runner``, ``RunResult``,
``StreamEvent``), with :mod:`chatflow_cli.core.cancel` beside it (cancel requests, Ctrl-C,
the ``run_async`` pool and bridge: public, the front-ends use it too); these modules are
private:

* :mod:`.host` -- the attributes and methods the Runner's parts share, declared once.
* :mod:`.turn` -- the turn itself (``TurnLoop``, mixed into the Runner): begun, the model
  asked, tools run, handoffs followed, its ending stored; and the context window of each
  request (``ContextWindow``, mixed into the Runner): the token budget, the turns that fit
  it, automatic compaction.
* :mod:`.lifecycle` -- what a run asks the store to start (``TurnRequest``), what one turn
  carries between model requests (``TurnState``), the internal signals (broken reply,
  invalid tool call after tools ran), and what a run gives its caller (``RunResult`` and
  ``StreamEvent``, public through the runner module); a turn's beginning, on a busy
  session (the store's queue, polling, and releasing the queue ticket and message claim
  of a turn that never started), and its ending when it did not complete (an interrupted
  or failed turn stored from the session in memory or, when that fails, from a fresh copy
  of the store's).
* :mod:`.tools` -- running one reply's tool calls: unknown tools and handoffs answered,
  the others concurrently on daemon threads (a ``sequential`` tool's calls one after another,
  in order), every error turned into text the model sees.
"""
