"""Untrusted text made safe to show on a terminal.

Group names, bodies, settings, paths and the names quoted in error messages
come from messages, from the spool or from other users: printed raw, an
escape sequence in them would reach the terminal (set its title, clear the
screen, rewrite what was shown, or worse). Every human-readable line the CLI
prints passes through :func:`terminal_text`; the machine formats (``--json``,
which is ASCII by construction, and the Prometheus text) stay exact.
"""

from __future__ import annotations

import logging
import re
import sys

# C0 (tab and newline too: a name must not break a line), DEL and C1 (the 8-bit
# CSI \x9b among them); U+2028/U+2029, line breaks to some terminals; the
# characters with the Unicode Bidi_Control property, which reorder what
# follows them (the "Trojan Source" overrides and isolates, and the marks);
# lone surrogates: what cannot be UTF-8 (surrogateescape keeps undecodable
# bytes of file names as U+DC80-U+DCFF).
_OTHERS = "\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_UNSAFE_IN_LINE = re.compile(f"[\x00-\x1f{_OTHERS}]")
_UNSAFE_IN_TEXT = re.compile(f"[\x00-\x08\x0b-\x1f{_OTHERS}]")  # tab and newline kept
_SHORT = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _SHORT:
        return _SHORT[char]
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte, as surrogateescape keeps it
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def terminal_text(text: str | bytes, multiline: bool = False) -> str:
    r"""``text`` with every character a terminal would act on, rather than
    show, written as a visible escape (``\x1b``, ``\x9b``, ``\u202e``, ``\n``);
    invalid UTF-8 in bytes shows as ``\xff``. With ``multiline``, newlines
    and tabs stay (a message body); otherwise they are escaped too (a name
    in a line). For display only: a backslash in the text stays as it is,
    so the result is not meant to be parsed back."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "surrogateescape")
    return (_UNSAFE_IN_TEXT if multiline else _UNSAFE_IN_LINE).sub(_escape, text)


class TerminalLastResort(logging.Handler):
    """The handler of last resort (``logging.lastResort``) of the CLI: like
    the standard one, warnings and errors on stderr when nothing configured
    logging, but with the message rendered by :func:`terminal_text` (the
    library's warnings quote paths and names from the spool)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = terminal_text(record.getMessage())
            if record.exc_info:
                text += "\n" + terminal_text(logging.Formatter().formatException(record.exc_info), multiline=True)
            sys.stderr.write(text + "\n")
        except Exception:  # as logging does: a failing handler never breaks the program
            self.handleError(record)
