"""Source text as the interpreter sees it: decoded per PEP 263 and split into lines where
the compiler numbers them."""

from __future__ import annotations

import codecs
import io
import os
import re
import stat
import tokenize


def read_source(path: str) -> str:
    """The text of a source file, decoded as Python decodes it (its coding cookie or a UTF-8
    byte-order mark, else UTF-8); undecodable bytes become U+FFFD. OSError propagates, also
    for a path that is not a regular file (a FIFO or a device is never opened: its text
    cannot be read a second time, and opening a FIFO can block)."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise OSError(f"not a regular file: {path}")
    with open(path, "rb") as f:
        data = f.read()
    return read_text(data)


def read_text(data: bytes) -> str:
    """``data`` (the bytes of a source file) decoded as :func:`read_source` decodes them."""
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


# A coding declaration as CPython's file reader finds it (Parser/tokenizer.c,
# get_coding_spec): a comment line's "coding" followed by ':' or '=' and the name.
_CODING = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)", re.ASCII)
_CODE = re.compile(rb"^[ \t\f]*[^ \t\f#\r\n]")  # a line with something besides a comment
_FIRST_TWO_LINES = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)?(?:[^\r\n]*(?:\r\n|\r|\n)?)?")


def _normal_encoding_name(name: str) -> str:
    """get_normal_name of CPython's tokenizer: the spellings of UTF-8 and Latin-1 as one."""
    n = name[:12].lower().replace("_", "-")
    if n == "utf-8" or n.startswith("utf-8-"):
        return "utf-8"
    if n in ("latin-1", "iso-8859-1", "iso-latin-1") or n.startswith(
            ("latin-1-", "iso-8859-1-", "iso-latin-1-")):
        return "iso-8859-1"
    return name


def file_reader_error(source: bytes, filename: str, seekable: bool = True) -> SyntaxError | None:
    """The SyntaxError that ``python FILE`` raises for a file holding ``source`` before its
    code is parsed, or None. CPython reads a script file line by line and refuses, with
    messages of its own that ``compile()`` of the same bytes does not give (it even compiles
    some such sources):

    - a line that is not UTF-8 when no encoding is declared (no byte-order mark, no coding
      comment in the first two lines): "Non-UTF-8 code starting with '\\xe9' in file F on line
      N, but no encoding declared; ...", also in a comment;
    - a coding comment naming an encoding Python does not know ("encoding problem: NAME"), or
      one other than UTF-8 after a UTF-8 byte-order mark ("encoding problem: NAME with BOM"),
      or any but UTF-8 in a file that is not ``seekable`` (a pipe: python reopens the file
      at the declaration to decode the rest);
    - a null byte ("source code cannot contain null bytes", at its line).

    The first such line wins, also over a syntax error on an earlier line (python reports a
    parse error only after reading the whole file). Not reproduced: a declared encoding that
    cannot decode the bytes (python's message depends on where its buffered reader stops);
    compile() reports that one, as it reports every other syntax error."""
    if b"\0" not in source and seekable:
        try:
            source.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:
            head = _FIRST_TWO_LINES.match(source)  # matches any input: each part is optional
            if head is not None and b"coding" not in head.group():
                return None  # the common case: UTF-8, nothing declared, no null byte
    bom = source.startswith(codecs.BOM_UTF8)
    encoding: str | None = "utf-8" if bom else None
    declaring = True  # the first two lines may still declare an encoding
    for number, line in enumerate(source.splitlines(keepends=True), 1):
        if number == 1 and bom:
            line = line[len(codecs.BOM_UTF8):]
        if declaring:
            m = _CODING.match(line)
            if m is not None:
                declaring = False
                name = _normal_encoding_name(m.group(1).decode("ascii"))
                if encoding is None:
                    if name != "utf-8":
                        try:
                            codecs.lookup(name)
                        except LookupError:
                            return SyntaxError(f"encoding problem: {name}")
                        if not seekable:
                            return SyntaxError(f"encoding problem: {name}")
                    encoding = name
                elif name != encoding:
                    return SyntaxError(f"encoding problem: {name} with BOM")
            elif _CODE.match(line) or number >= 2:
                declaring = False
        nul = line.find(b"\0")
        checked = line if nul < 0 else line[:nul]  # the reader's check stops at a null byte
        if encoding is None:
            try:
                checked.decode("utf-8")
            except UnicodeDecodeError as e:
                return SyntaxError(
                    f"Non-UTF-8 code starting with '\\x{checked[e.start]:02x}' in file "
                    f"{filename} on line {number}, but no encoding declared; see "
                    "https://peps.python.org/pep-0263/ for details")
        if nul >= 0:
            text = checked.decode(encoding or "utf-8", errors="replace")
            return SyntaxError("source code cannot contain null bytes",
                               (filename, number, 0, text, number, 0))
    return None
