"""A parser of the Prometheus text exposition format 0.0.4, for the few metrics we read.

What an engine's ``/metrics`` answers is parsed line by line; only lines whose metric
name was asked for are parsed beyond a prefix check, so a body of a few hundred KB of
histograms costs little when we want three gauges from it.

What counts as a well-formed line follows the Prometheus server's own parser
(``expfmt``). One difference is deliberate: where the server drops a whole scrape for
one bad line, this parser skips that line and keeps the rest. It never raises on input.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator, Mapping
from typing import NamedTuple

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# One `name="value"` pair and what follows it. A label value may hold any character but
# a raw newline; a backslash must start one of the three escapes the format defines.
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\[\\"n])*)"[ \t]*')
_ESCAPE = re.compile(r"\\(.)")
_UNESCAPED = {"\\": "\\", '"': '"', "n": "\n"}
_BLANKS = " \t"


class Sample(NamedTuple):
    """One sample line: metric name, labels (unescaped) and value.

    The sample's own timestamp, when the line has one, is checked and dropped: the
    poller dates readings by its own clock, at the scrape.
    """

    name: str
    labels: Mapping[str, str]
    value: float


def parse_samples(text: str, names: Collection[str]) -> Iterator[Sample]:
    """Yield the samples in ``text`` whose metric name is one of ``names``, in order.

    ``# HELP``, ``# TYPE`` and other comment lines, blank lines and lines of other
    metrics are passed over. A value may be any float the format allows, including
    ``NaN``, ``+Inf`` and ``-Inf``. A malformed line of a wanted metric (bad label
    syntax, an unknown escape, a repeated label, a value or timestamp that is not a
    number, text after the timestamp) is skipped; the generator never raises.
    """
    wanted = frozenset(names)
    prefixes = tuple(wanted)
    if not prefixes:
        return
    for raw in text.split("\n"):
        line = raw.lstrip(_BLANKS)
        if not line.startswith(prefixes):
            continue
        match = _NAME.match(line)
        if match is None or match.group() not in wanted:
            continue
        sample = _parse_rest(match.group(), line, match.end())
        if sample is not None:
            yield sample


def _parse_rest(name: str, line: str, pos: int) -> Sample | None:
    """The sample on ``line`` after its metric name (ending at ``pos``), or None."""
    labels: dict[str, str] = {}
    after_name = pos
    pos = _skip_blanks(line, pos)
    if line.startswith("{", pos):
        end = _parse_labels(line, pos + 1, labels)
        if end is None:
            return None
        pos = end
    elif pos == after_name:
        return None  # the name runs into a character that cannot follow it
    fields = line[pos:].split()
    if not 1 <= len(fields) <= 2:
        return None
    value = _parse_float(fields[0])
    if value is None or (len(fields) == 2 and not _is_timestamp(fields[1])):
        return None
    return Sample(name, labels, value)


def _parse_labels(line: str, pos: int, labels: dict[str, str]) -> int | None:
    """Fill ``labels`` from the set starting at ``pos`` (after ``{``); the index after ``}``.

    A trailing comma before ``}`` is allowed, as in ``expfmt``.
    """
    while True:
        pos = _skip_blanks(line, pos)
        if line.startswith("}", pos):
            return pos + 1
        match = _LABEL.match(line, pos)
        if match is None:
            return None
        label, value = match.groups()
        if label in labels:
            return None
        labels[label] = _unescape(value)
        pos = match.end()
        if line.startswith(",", pos):
            pos += 1
        elif line.startswith("}", pos):
            return pos + 1
        else:
            return None


def _skip_blanks(line: str, pos: int) -> int:
    while pos < len(line) and line[pos] in _BLANKS:
        pos += 1
    return pos


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return _ESCAPE.sub(lambda escape: _UNESCAPED[escape.group(1)], value)


def _parse_float(token: str) -> float | None:
    # float() also takes digit separators ("1_000"), which the format does not.
    if "_" in token:
        return None
    try:
        return float(token)
    except ValueError:
        return None


def _is_timestamp(token: str) -> bool:
    """Whether ``token`` is a timestamp: milliseconds since the epoch, an integer."""
    digits = token[1:] if token[:1] in ("-", "+") else token
    return digits.isascii() and digits.isdigit()
