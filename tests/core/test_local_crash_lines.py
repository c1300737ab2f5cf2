"""The one-line report of a dead local model server: one structure for every way of dying,
and the useful end of its output rather than llama.cpp's start-up log."""

from __future__ import annotations

import signal

import pytest

from chatflow_cli.core.local import crash_error

LOG = "/data/local/server-0123.log"
AGAIN = "send the message again to start a new one (/retry in the REPL)"

#: What the real SmolLM2 server writes before its first decode (llama.cpp's informational log).
LLAMA_STARTUP = """\
llama_model_loader: - kv   0:                       general.architecture str              = llama
load_tensors: loading model tensors, this can take a while... (mmap = true)
load_tensors:   CPU_Mapped model buffer size =    82.18 MiB
.............................................
llama_context: constructing llama_context
llama_context: n_ctx         = 2048
llama_kv_cache_unified:        CPU KV buffer size =    45.00 MiB
load: special tokens cache size = 17
print_info: file type   = Q4_1
graph_reserve: reserving a graph for ubatch with n_tokens =    1, n_seqs =  1, n_outputs =    1
set_abort_callback: call
sched_reserve: graph: nodes = 1086, leafs = 2 (with bs=512), 3 (with bs=1)
sched_reserve: reserve took 5.21 ms
INFO:     Started server process [4242]
INFO:     Uvicorn running on http://127.0.0.1:45609 (Press CTRL+C to quit)
"""

FATAL = """\
Fatal Python error: Illegal instruction

Thread 0x00007f3a1b7fe640 (most recent call first):
  File "/venv/lib/python3.12/site-packages/llama_cpp/llama.py", line 640 in eval
  File "/venv/lib/python3.12/site-packages/llama_cpp/llama.py", line 1212 in _create_completion

Extension modules: numpy.core._multiarray_umath, yaml._yaml (total: 12)
"""


@pytest.mark.parametrize("returncode", [-signal.SIGILL, -signal.SIGSEGV, -signal.SIGBUS, -signal.SIGKILL,
                                        -signal.SIGABRT, 1, 3, None])
@pytest.mark.parametrize("phase", ["starting", "answering"])
def test_every_crash_line_says_to_send_again_and_where_the_log_is(returncode, phase) -> None:
    line = str(crash_error(returncode, "standin: something went wrong\n", phase=phase, log_path=LOG))
    assert line.startswith(f"the local model server crashed while {phase}: ")
    assert "; its output ends: 'standin: something went wrong'; " in line
    assert AGAIN in line
    assert line.endswith(f"; its log: {LOG}")
    assert "\n" not in line


def test_sigill_advises_sending_again_before_a_reinstall() -> None:
    line = str(crash_error(-signal.SIGILL, "", phase="answering", log_path=LOG))
    assert line == (
        "the local model server crashed while answering: killed by SIGILL (illegal instruction); it wrote nothing; "
        f"{AGAIN}; if it crashes again, this CPU advertises instructions the machine cannot run (a VM?): "
        'reinstall llama-cpp-python built for a generic CPU: CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install '
        f"--force-reinstall --no-cache-dir llama-cpp-python; its log: {LOG}")


def test_a_private_server_without_a_log_file_names_none() -> None:
    line = str(crash_error(-signal.SIGILL, "", phase="answering"))
    assert AGAIN in line and "its log" not in line


def test_llama_cpp_start_up_chatter_is_not_the_output_shown() -> None:
    line = str(crash_error(-signal.SIGILL, LLAMA_STARTUP + FATAL, phase="answering", log_path=LOG))
    assert "sched_reserve" not in line and "graph" not in line and "Uvicorn" not in line, line
    assert "set_abort_callback" not in line, line  # an error word in a function name is not an error
    assert "its output ends: 'Fatal Python error: Illegal instruction'" in line, line


def test_errors_and_the_python_exception_are_kept_among_the_chatter() -> None:
    tail = LLAMA_STARTUP + (
        "llama_model_load: error loading model: tensor blk.0.attn_q.weight data is not within the file bounds\n"
        "sched_reserve: reserve took 5.21 ms\n"
        "Traceback (most recent call last):\n"
        '  File "/venv/lib/python3.12/site-packages/llama_cpp/llama.py", line 372, in __init__\n'
        "ValueError: Failed to load model from file: /models/SmolLM2.gguf\n"
        "INFO:     Waiting for application shutdown.\n"
    )
    line = str(crash_error(1, tail, phase="starting", log_path=LOG))
    assert ("its output ends: 'llama_model_load: error loading model: tensor blk.0.attn_q.weight data is "
            "not within the file bounds' | 'ValueError: Failed to load model from file: /models/SmolLM2.gguf'") in line
    assert "sched_reserve" not in line and "INFO" not in line


def test_what_the_program_said_before_the_signal_comes_before_the_fatal_message() -> None:
    tail = LLAMA_STARTUP + "standin: decoding hit an instruction this CPU traps\n" + FATAL
    line = str(crash_error(-signal.SIGILL, tail, phase="answering", log_path=LOG))
    assert "its output ends: 'standin: decoding hit an instruction this CPU traps';" in line


def test_with_nothing_useful_the_raw_tail_is_shown() -> None:
    line = str(crash_error(-signal.SIGKILL, "sched_reserve: graph: nodes = 1086\nsched_reserve: reserve took 5 ms\n",
                           phase="answering", log_path=LOG))
    assert "its output ends: 'sched_reserve: graph: nodes = 1086' | 'sched_reserve: reserve took 5 ms'" in line
