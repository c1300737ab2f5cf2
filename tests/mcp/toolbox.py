"""A real MCP server for the tests, written with the ``mcp`` SDK's own server (``MCPServer``,
the SDK's FastMCP): ``python tests/mcp/toolbox.py`` serves on stdio,
``python tests/mcp/toolbox.py http PORT`` over streamable HTTP on 127.0.0.1.

Its tools are scripted to behave well and badly: ``echo``, ``add`` (structured content),
``fail`` (an ``isError`` result), ``huge`` (a long text), ``picture`` (an image whose header is
broken), ``photo`` (a caption and a real PNG of the size asked), ``crash``
(exits mid-call, after a line on stderr), ``hang`` (never answers), ``noise`` (a line of
garbage on stdout, then a result), ``malformed`` (a response that is not a valid result),
``token`` (returns ``$TOOLBOX_TOKEN``: a careless tool echoing its secret), ``pid``,
``grumble`` (a traceback in a Rich box on stderr, then a result, or an exit).

``$TOOLBOX_ALIASES``: more names (comma-separated) for a tool that answers ``NAME: text``.
``$TOOLBOX_PIDFILE``: each start appends the process id to it. ``$TOOLBOX_BROKEN``: the
server writes it to stderr and exits 2 before speaking MCP. ``$TOOLBOX_STUBBORN``: the server
ignores SIGTERM and, once its stdin ends, keeps running; with ``$TOOLBOX_CHILD`` it also starts
a child process as stubborn (its id appended to ``$TOOLBOX_PIDFILE`` too).
``$TOOLBOX_EXIT_DELAY``: seconds the server takes to exit once its stdin ends.
"""

import json
import os
import sys

if os.environ.get("TOOLBOX_BROKEN"):
    sys.stderr.write(f"toolbox: {os.environ['TOOLBOX_BROKEN']}\n")
    sys.exit(2)
if os.environ.get("TOOLBOX_STUBBORN"):
    import signal
    import subprocess

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by the child: it ignores SIGTERM too
    if os.environ.get("TOOLBOX_CHILD"):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], stdin=subprocess.DEVNULL)
        if os.environ.get("TOOLBOX_PIDFILE"):
            with open(os.environ["TOOLBOX_PIDFILE"], "a") as out:
                out.write(f"{child.pid}\n")
if os.environ.get("TOOLBOX_PIDFILE"):
    with open(os.environ["TOOLBOX_PIDFILE"], "a") as out:
        out.write(f"{os.getpid()}\n")

import anyio  # noqa: E402
from mcp.server.mcpserver import Context, MCPServer  # noqa: E402
from mcp.server.mcpserver.exceptions import ToolError  # noqa: E402
from mcp.server.mcpserver.utilities.types import Image  # noqa: E402

server = MCPServer("toolbox")


@server.tool()
def echo(text: str) -> str:
    """Say the text back."""
    return text


def _alias(name: str) -> None:
    def said(text: str) -> str:
        return f"{name}: {text}"

    server.add_tool(said, name=name, description="Say the text back, with the tool's name.")


for _name in filter(None, os.environ.get("TOOLBOX_ALIASES", "").split(",")):
    _alias(_name)


@server.tool()
def add(a: int, b: int) -> dict[str, int]:
    """Add two numbers."""
    return {"sum": a + b}


@server.tool()
def fail(reason: str) -> str:
    """Fail with the reason (an isError result)."""
    raise ToolError(reason)


@server.tool()
def huge(size: int) -> str:
    """A text of `size` characters."""
    return ("0123456789" * (size // 10 + 1))[:size]


@server.tool()
def picture() -> Image:
    """A small PNG."""
    return Image(data=b"\x89PNG\r\n\x1a\n" + b"\0" * 92, format="png")


def _png(width: int, height: int) -> bytes:
    """A real PNG of ``width`` x ``height`` red pixels (any image reader decodes it)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = b"".join(b"\0" + bytes([200, 30, 30]) * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


@server.tool(structured_output=False)
def photo(width: int = 64, height: int = 32) -> list[object]:
    """A caption and a PNG of width x height pixels."""
    return ["a red rectangle", Image(data=_png(width, height), format="png")]


@server.tool()
def crash() -> str:
    """Exit in the middle of the call."""
    sys.stderr.write("toolbox: crashing on purpose\n")
    sys.stderr.flush()
    os._exit(3)


@server.tool()
def grumble(exit: bool = False) -> str:
    """Write a traceback drawn in a Rich box on stderr, then answer (or exit, with ``exit``)."""
    sys.stderr.write("╭──────────── Traceback (most recent call last) ────────────╮\n"
                     "│ /srv/toolbox.py:213 in grumble                            │\n"
                     "│ ❱ 213 │   raise ValueError('disk full')                   │\n"
                     "╰───────────────────────────────────────────────────────────╯\n"
                     "ValueError: disk full\n")
    sys.stderr.flush()
    if exit:
        os._exit(3)
    return "grumbled"


@server.tool()
async def hang() -> str:
    """Never answer (its start and a cancel request are noted in ``$TOOLBOX_LOG``)."""
    if os.environ.get("TOOLBOX_LOG"):
        with open(os.environ["TOOLBOX_LOG"], "a") as out:
            out.write("hang started\n")
    try:
        await anyio.sleep(3600)
    except anyio.get_cancelled_exc_class():
        if os.environ.get("TOOLBOX_LOG"):
            with open(os.environ["TOOLBOX_LOG"], "a") as out:
                out.write("hang cancelled\n")
        raise
    return "late"


def _wire(data: bytes) -> None:
    """Write on the protocol's stdout itself: the SDK's server moves fd 1 to stderr while it
    serves (so a stray print cannot break the protocol), keeping the wire on a private fd."""
    from mcp.server import stdio

    claim = stdio._claims.get(1)
    os.write(claim.private_fd if claim is not None and claim.private_fd is not None else 1, data)


@server.tool()
def noise() -> str:
    """Write garbage on stdout, then answer."""
    _wire(b"this is not JSON-RPC\n")
    return "noisy but fine"


@server.tool()
async def malformed(ctx: Context) -> str:
    """Answer with a result that is not a CallToolResult."""
    rid = ctx.request_id
    bad = {"jsonrpc": "2.0", "id": int(rid) if rid.isdigit() else rid, "result": {"content": "not a list"}}
    _wire((json.dumps(bad) + "\n").encode())
    await anyio.sleep(0.5)
    return "too late"


@server.tool()
def token() -> str:
    """Return the server's token (a careless tool)."""
    return f"token is {os.environ.get('TOOLBOX_TOKEN', '')}"


@server.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
        if os.environ.get("TOOLBOX_EXIT_DELAY"):
            import time

            time.sleep(float(os.environ["TOOLBOX_EXIT_DELAY"]))
        if os.environ.get("TOOLBOX_STUBBORN"):  # its stdin ended: a stubborn server stays
            import time

            while True:
                time.sleep(3600)
