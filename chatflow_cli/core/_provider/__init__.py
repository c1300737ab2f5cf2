"""How a Chat Completions request reaches a provider: the private machinery behind
:class:`~chatflow_cli.core.model.ModelClient` and :class:`~chatflow_cli.core.model.ModelStream`.

One room per concern; :mod:`chatflow_cli.core.model` is the only public face:

* :mod:`.retry` -- the ``Retry-After`` reading and the retry rules both transports follow.
* :mod:`.http` -- the ``http`` transport: the request sent with ``httpx2`` alone; and the
  abortable connections (of both transports) that let a cancel wake a blocked read.
* :mod:`.plain` -- the reading of a server that answered with one JSON body.
* :mod:`.errors` -- every failure of either transport mapped to one chatflow error, with
  the API key kept out of its message; how a connection broke mid-reply.

The reply's folding and verdict are in :mod:`chatflow_cli.core.stream`.
"""
