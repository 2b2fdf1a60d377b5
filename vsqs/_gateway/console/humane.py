"""Numbers, times and text as people read them (``1.2k``, ``3 min ago``),
and the safe rendering of anything that came from a message or a queue:
control, format and bidirectional characters are shown as escapes, never
passed to the terminal-like page, and bodies that are no UTF-8 text are
shown in hex. No I/O; the templates call these as filters."""

from __future__ import annotations

import math
import time
import unicodedata

_SHOWN_AS_ESCAPES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})  # controls, bidi/format, unassigned
HEX_BYTES = 256  # bytes of a binary body shown in hex


def count(value: float | None) -> str:
    """``950``, ``1.2k``, ``35k``, ``1.2M``: three significant figures at most."""
    if value is None:
        return "–"
    try:
        number = float(value)
    except OverflowError:  # an int past a float's range (a page's ?n= is any int)
        return "–"
    if not math.isfinite(number):
        return "–"
    sign = "-" if number < 0 else ""
    number = abs(number)
    for limit, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if number >= limit:
            scaled = number / limit
            text = f"{scaled:.1f}" if scaled < 10 else f"{scaled:.0f}"
            return sign + text.removesuffix(".0") + suffix
    return sign + (f"{number:.0f}" if number >= 10 or number == int(number) else f"{number:.1f}")


def duration(seconds: float | None) -> str:
    """``0 s``, ``42 s``, ``3 min``, ``5 h``, ``2 d``."""
    if seconds is None or not math.isfinite(seconds):
        return "–"
    seconds = max(0.0, seconds)
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def ago(epoch: float | None, now: float | None = None) -> str:
    """``just now``, ``3 min ago``, ``in 20 s`` (a time to come)."""
    if epoch is None or not math.isfinite(epoch):
        return "–"
    delta = (time.time() if now is None else now) - epoch
    if abs(delta) < 1:
        return "just now"
    return f"{duration(delta)} ago" if delta > 0 else f"in {duration(-delta)}"


def size(value: int | None) -> str:
    """``512 B``, ``1.2 KiB``, ``3 MiB``."""
    if value is None:
        return "–"
    number = float(value)
    for limit, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if number >= limit:
            scaled = number / limit
            return (f"{scaled:.1f}" if scaled < 10 else f"{scaled:.0f}").removesuffix(".0") + " " + unit
    return f"{number:.0f} B"


def rate(per_second: float | None) -> str:
    """A change of depth: ``+12/s``, ``-3/min``, ``steady``; ``–`` without history."""
    if per_second is None:
        return "–"
    if per_second == 0:
        return "steady"
    sign = "+" if per_second > 0 else "-"
    magnitude = abs(per_second)
    if magnitude >= 1:
        return f"{sign}{count(magnitude)}/s"
    return f"{sign}{count(magnitude * 60)}/min"


def text_parts(text: str) -> list[tuple[str, str]]:
    """``text`` cut into ``("text", ...)`` runs and ``("escape", "\\x1b")``
    pieces for every character a page must not pass on as is (controls
    other than newline and tab, bidirectional overrides, zero-width and
    unassigned characters). The template escapes both for HTML."""
    parts: list[tuple[str, str]] = []
    run: list[str] = []
    for char in text:
        if char not in "\n\t" and unicodedata.category(char) in _SHOWN_AS_ESCAPES:
            if run:
                parts.append(("text", "".join(run)))
                run = []
            code = ord(char)
            parts.append(("escape", f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000
                          else f"\\U{code:08x}"))
        else:
            run.append(char)
    if run:
        parts.append(("text", "".join(run)))
    return parts


def plain(text: object) -> str:
    """A name, group or attribute on one line: every character :func:`text_parts`
    escapes (newlines and tabs too) written as its escape."""
    out = []
    for kind, piece in text_parts(str(text)):
        out.append(piece if kind == "escape" else piece.replace("\n", "\\n").replace("\t", "\\t"))
    return "".join(out)


def body_view(
    data: bytes | None, force_hex: bool = False, cut: bool = False
) -> tuple[str, list[tuple[str, str]] | str]:
    """How to show a body's preview: ``("text", parts)`` for UTF-8 text (a
    preview ``cut`` from a longer body may end mid-character), ``("hex",
    "68 65 6c ...")`` for anything else (or when asked)."""
    if data is None:
        return "text", []
    if not force_hex:
        try:
            return "text", text_parts(data.decode("utf-8"))
        except UnicodeDecodeError as exc:
            if cut and exc.start >= len(data) - 3 and exc.reason == "unexpected end of data":
                return "text", text_parts(data[: exc.start].decode("utf-8"))
    return "hex", " ".join(f"{byte:02x}" for byte in data[:HEX_BYTES])
