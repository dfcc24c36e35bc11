"""PromQL label matchers, as the rules' `selector` setting gives them: `job="fleetcanary", cluster=~"a|b"`.

The settings go into every selector of every rule; a selector with a lost quote used to make rules that
promtool rejected, written with exit 0. This reads the matchers as PromQL's lexer does (a label name, one of
= != =~ !~, a double-, single- or back-quoted string with Go's escapes; commas between; a trailing comma
allowed) and says in one line what is wrong and where.
"""
from __future__ import annotations

import re

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
OPS = ("=~", "!~", "!=", "=")
ESCAPES = set("abfnrtv\\'\"0123456789xuU")


def _string(text: str, i: int) -> tuple[str, int]:
    """The string literal starting at text[i] (its quote): (raw content, index after it)."""
    quote = text[i]
    j = i + 1
    while j < len(text):
        c = text[j]
        if c == quote:
            return text[i + 1:j], j + 1
        if c == "\\" and quote != "`":
            if j + 1 >= len(text) or text[j + 1] not in ESCAPES:
                raise ValueError(f"unknown escape at character {j + 1}")
            j += 2
            continue
        if c == "\n" and quote != "`":
            raise ValueError(f"newline in a string at character {j + 1}")
        j += 1
    raise ValueError(f"unterminated string starting at character {i + 1} (a quote is missing)")


def parse(text: str) -> list[tuple[str, str, str]]:
    """The matchers as (name, op, raw value); ValueError with what is wrong and where."""
    out: list[tuple[str, str, str]] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            return out
        m = NAME.match(text, i)
        if not m:
            raise ValueError(f"a label name expected at character {i + 1}: {text[i:i + 20]!r}")
        name, i = m.group(), m.end()
        while i < n and text[i].isspace():
            i += 1
        op = next((o for o in OPS if text.startswith(o, i)), None)
        if op is None:
            raise ValueError(f"one of = != =~ !~ expected after {name!r} at character {i + 1}")
        i += len(op)
        while i < n and text[i].isspace():
            i += 1
        if i >= n or text[i] not in "\"'`":
            raise ValueError(f"a quoted value expected after {name}{op} at character {i + 1}")
        value, i = _string(text, i)
        if op in ("=~", "!~"):
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"{name}{op}: not a regular expression: {exc}") from None
        out.append((name, op, value))
        while i < n and text[i].isspace():
            i += 1
        if i < n:
            if text[i] != ",":
                raise ValueError(f"',' expected between matchers at character {i + 1}: {text[i:i + 20]!r}")
            i += 1
