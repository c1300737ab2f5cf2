"""The rule of the one terminal sanitizer, where every layer can read it.

The tables say what each control character becomes (see
:func:`chatflow_cli.render.text.safe_text`, the sanitizer front-ends call). They live in a
leaf so that the core can show a name or a path the user gave in one inert line, in an error
message or an export, by the same rule: :func:`one_line`.
"""

from __future__ import annotations

__all__ = ["BIDI_CONTROLS", "LINE_SEPARATORS", "LINE_TABLE", "TEXT_TABLE", "one_line"]

#: Bidirectional formatting characters: they reorder what a terminal shows ("Trojan Source").
BIDI_CONTROLS = frozenset(
    [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
)
#: Characters that end a line for Unicode or for ``str.splitlines`` besides ``\n``.
LINE_SEPARATORS = frozenset([0x2028, 0x2029])


def _picture(code: int) -> str:
    if code < 0x20:
        return chr(0x2400 + code)  # control pictures: ESC -> "␛", CR -> "␍", VT -> "␋"
    if code == 0x7F:
        return "\u2421"  # "␡"
    if 0xD800 <= code <= 0xDFFF:
        return "\ufffd"  # a lone surrogate cannot be written as UTF-8 at all
    return f"<U+{code:04X}>"  # C1 controls (NEL, the one-byte CSI U+009B...), bidi controls


def _sanitizer_table(*, one_line: bool) -> dict[int, str]:
    table = {code: _picture(code) for code in [*range(0x20), 0x7F, *range(0x80, 0xA0), *BIDI_CONTROLS]}
    table.update(dict.fromkeys(range(0xD800, 0xE000), _picture(0xD800)))  # 2,048 lone surrogates, one picture
    if one_line:
        table.update({0x09: " ", 0x0A: " ", **{code: " " for code in LINE_SEPARATORS}})
    else:
        del table[0x09], table[0x0A]
        table.update({code: "\n" for code in LINE_SEPARATORS})
    return table


#: Text kept on its lines (``\n`` and tab kept).
TEXT_TABLE = _sanitizer_table(one_line=False)
#: One line: nothing in the result starts a new line.
LINE_TABLE = _sanitizer_table(one_line=True)


def one_line(text: str | None) -> str:
    """``text`` inert and on one line: ``safe_text(text, one_line=True)`` of
    :mod:`chatflow_cli.render.text`, for the core (a file name or path in an error line,
    the ``Attached:`` line of a Markdown export)."""
    if not text:
        return ""
    if "\r" in text:
        text = text.replace("\r\n", "\n")
    return text.translate(LINE_TABLE)
