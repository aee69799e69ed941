"""Text from a model or a file (node, tensor, input and graph names, op types, doc strings, paths, onnxruntime's
messages about them) made safe for the place it is printed: one function per output format.

* :func:`text`: terminals, text reports, error and log lines, rich tables (whose console has markup off).
* :func:`markdown` and :func:`markdown_code`: Markdown text and code spans (GitHub-flavoured; CI job summaries,
  pull-request comments), also inside table cells.
* :func:`html_text` and :func:`json_for_script`: HTML text and attributes, and JSON inside a ``<script>`` (the
  report page and the batch index page); :func:`url_path`: a file path as a link. JSON files keep every string
  exact (``json.dumps`` writes control characters as ``\\u001b`` escapes).

A name is data: it must not move the cursor, clear the screen, set a terminal title (ANSI/OSC escape sequences),
overwrite a line (``\\r``), add a line (``\\n``) to a one-line message or a Markdown table, or be read as
formatting (rich markup ``[red]``, Markdown ``|``, ``#``, ``*``, ``<b>``).
"""

from __future__ import annotations

import html
import json
import re
import unicodedata
from typing import Any

#: Unicode categories written as escapes by :func:`text`: control characters (Cc: C0, DEL, C1; ESC starts the
#: ANSI sequences), format characters (Cf: bidi overrides that reorder what a line shows, zero-width characters),
#: line and paragraph separators (Zl, Zp) and lone surrogates (Cs). Source: the Unicode Character Database,
#: General_Category values (UAX #44, section 5.7.1).
ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}

#: The ASCII punctuation that means something in GitHub-flavoured Markdown anywhere in a line: the backslash,
#: code spans, emphasis, links and images, HTML (``<``), entities (``&``), block quotes and headings (``>``, ``#``),
#: table cells (``|``), strikethrough (``~``), math (``$``) and mentions (``@``). A backslash before any ASCII
#: punctuation character shows that character (CommonMark spec 0.30, section 2.4 "Backslash escapes").
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]<>#|~&!$@])")

#: At the start of a line, ``+``, ``-`` and ``=`` also begin a list item or underline a heading.
_MARKDOWN_LEADING = re.compile(r"^([+\-=])")


def _escape_char(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def text(value: object) -> str:
    """``str(value)`` for a terminal or a text file: each character of :data:`ESCAPED_CATEGORIES` written as a
    Python-style escape (``\\x1b``, ``\\n``, ``\\r``, ``\\t``, ``\\u202e``); everything else, backslashes
    included, unchanged. The result holds no line break and no escape sequence."""
    s = str(value)
    if s.isprintable():  # the common case: no control, format or separator character (spaces are printable)
        return s
    return "".join(_escape_char(ch) if unicodedata.category(ch) in ESCAPED_CATEGORIES else ch for ch in s)


def markdown(value: object) -> str:
    """``str(value)`` as Markdown text that shows it literally, in a paragraph, a list item, a heading or a table
    cell: :func:`text` (no line break), then a backslash before each character of ``_MARKDOWN_SPECIAL`` (``|``
    that would end a table cell, backticks, ``*``, ``_``, ``[``, ``<`` that would open HTML, ``#``, ``>`` ...) and
    before a leading ``+``, ``-`` or ``=``. Rendered, it reads as ``value`` with :func:`text`'s escapes."""
    return _MARKDOWN_LEADING.sub(r"\\\1", _MARKDOWN_SPECIAL.sub(r"\\\1", text(value)))


def markdown_code(value: object) -> str:
    """``str(value)`` as a Markdown code span that shows it literally: :func:`text` (no line break), fenced by one
    more backtick than its longest run of backticks, padded with a space where it starts or ends with a backtick
    (CommonMark spec 0.30, section 6.1 "Code spans"). In a table cell, a ``|`` needs a backslash as well, which
    a row writer adds to every cell (GFM spec, "Tables": the escape works inside code spans). An empty value
    gives an empty string (a code span cannot be empty)."""
    s = text(value)
    if not s:
        return ""
    fence = "`" * (max((len(run) for run in re.findall(r"`+", s)), default=0) + 1)
    pad = " " if s[0] == "`" or s[-1] == "`" or (s[0] == " " and s[-1] == " " and s.strip()) else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def escaped(obj, fn=text):
    """A copy of ``obj`` (dicts, lists, tuples, strings, other values as they are) with ``fn`` applied to every
    string, dict keys included: a report's dict made safe for a terminal in one step."""
    if isinstance(obj, str):
        return fn(obj)
    if isinstance(obj, dict):
        return {escaped(k, fn): escaped(v, fn) for k, v in obj.items()}
    if isinstance(obj, list):
        return [escaped(v, fn) for v in obj]
    if type(obj) is tuple:
        return tuple(escaped(v, fn) for v in obj)
    return obj


def html_text(value: Any) -> str:
    """``str(value)`` with ``&``, ``<``, ``>``, ``"`` and ``'`` escaped (``html.escape``): safe as HTML text and in a
    quoted attribute."""
    return html.escape(str(value))


def json_for_script(value: Any) -> str:
    """JSON safe inside ``<script>``: ``<``, ``>`` and ``&`` escaped, so no ``</script>`` can end it early.

    Raises:
        ValueError: ``value`` holds a NaN or an infinity (no JSON number).
    """
    text = json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def url_path(rel: str) -> str:
    """A relative file path as a relative URL for ``href`` or a Markdown link: each part percent-encoded
    (``urllib.parse.quote``, RFC 3986 section 2.1), so that ``#``, ``%``, ``?``, ``:``, spaces and parentheses in
    a file name stay part of the path (never a fragment, a query, or a scheme such as ``javascript:``), and
    ``./`` in front. HTML still needs :func:`html_text` around it (``&`` is left as it is)."""
    from urllib.parse import quote

    return "./" + quote(rel, safe="/")
