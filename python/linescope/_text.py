"""Source text as the interpreter sees it: decoded per PEP 263 and split into lines where
the compiler numbers them."""

from __future__ import annotations

import io
import tokenize


def read_source(path: str) -> str:
    """The text of a source file, decoded as Python decodes it (its coding cookie or a UTF-8
    byte-order mark, else UTF-8); undecodable bytes become U+FFFD. OSError propagates."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError:  # an unknown or inconsistent coding cookie
        encoding = "utf-8"
    return data.decode(encoding, errors="replace").removeprefix("\ufeff")


def source_lines(text: str) -> list[str]:
    """The lines of `text` with their endings, split only at \\n, \\r\\n and \\r (the line
    numbers of code objects and tracebacks); str.splitlines would also split at form feeds,
    U+2028 and other characters that do not end a Python line."""
    return io.StringIO(text, newline=None).readlines()
