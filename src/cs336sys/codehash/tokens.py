"""The tokens a statement's hash is made of: comments, line breaks inside brackets and inert trailing commas
left out, string and number literals written canonically, an f-string as its source text (see the package's
docstring for why tokens and not `ast.dump`)."""

from __future__ import annotations

import ast
import io
import token
import tokenize
from functools import cache


@cache  # a module repeats its literals (0, 1, "cuda"): each text is evaluated once a process
def _canonical_literal(text: str) -> str:
    try:
        return repr(ast.literal_eval(text))
    except (ValueError, SyntaxError):  # an f-string: its source text
        return text


def _tokens(source: str) -> list[tuple[int, int, str]]:
    """(line, column, canonical text) of each significant token, comments and line breaks inside
    brackets left out; an f-string is one token of its source text (Python 3.12 splits it)."""
    lines = source.splitlines(keepends=True)
    out: list[tuple[int, int, str]] = []
    fstring_start, depth = None, 0
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        kind = tok.type
        name = token.tok_name[kind]
        if name == "FSTRING_START":
            if depth == 0:
                fstring_start = tok.start
            depth += 1
            continue
        if name == "FSTRING_END":
            depth -= 1
            if depth == 0:
                (l0, c0), (l1, c1) = fstring_start, tok.end
                text = "".join(lines[l0 - 1:l1])[c0:len("".join(lines[l0 - 1:l1 - 1])) + c1]
                out.append((l0, c0, text))
            continue
        if depth:
            continue
        if kind in (tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER):
            continue
        if kind == tokenize.NEWLINE:
            text = ";"
        elif kind == tokenize.INDENT:
            text = "<indent>"
        elif kind == tokenize.DEDENT:
            text = "<dedent>"
        elif kind in (tokenize.STRING, tokenize.NUMBER):
            text = _canonical_literal(tok.string)
        else:
            text = tok.string
        out.append((tok.start[0], tok.start[1], text))
    return _drop_inert_trailing_commas(out)


def _drop_inert_trailing_commas(toks: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """A comma before a closing bracket changes nothing where the bracket holds another comma at its
    level, and before `}` always; `(a,)` and `x[a,]` (a one-element tuple) keep theirs."""
    drop: set[int] = set()
    stack: list[list[int]] = []  # per open bracket: its commas
    for i, (_, _, text) in enumerate(toks):
        if text in ("(", "[", "{"):
            stack.append([])
        elif text == ",":
            if stack:
                stack[-1].append(i)
        elif text in (")", "]", "}") and stack:
            commas = stack.pop()
            if commas and commas[-1] == i - 1 and (text == "}" or len(commas) > 1):
                drop.add(i - 1)
    return [t for i, t in enumerate(toks) if i not in drop]
