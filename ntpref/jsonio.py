"""Reading the JSON files ntpref takes as input (tolerance files, the reference manifest), by the rules
of the npz reader: a regular file only (a FIFO or device is refused before it is read), at most
:data:`MAX_JSON_BYTES` bytes, at most :data:`MAX_DEPTH` levels of nesting, integers of at most
:data:`MAX_DIGITS` digits, every key of an object once. Every fault is one InputError naming the file."""
from __future__ import annotations

import json
import os
from pathlib import Path

from .errors import InputError
from .npzio import open_regular

#: Largest JSON input read (bytes); ntpref's own files are a few kilobytes.
MAX_JSON_BYTES = 16 << 20
#: Deepest nesting of arrays and objects accepted.
MAX_DEPTH = 64
#: Most digits of an integer accepted (a float64 tolerance or a count needs far fewer).
MAX_DIGITS = 30


def _unique_keys(pairs: list) -> dict:
    out = dict(pairs)
    if len(out) < len(pairs):
        from collections import Counter

        key, times = Counter(k for k, _ in pairs).most_common(1)[0]
        raise ValueError(f"key '{key}' appears {times} times")
    return out


def _integer(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits (at most {MAX_DIGITS})")
    return int(text)


def _depth(text: str) -> int:
    """The deepest nesting of brackets and braces outside strings."""
    depth = deepest = 0
    inside = escaped = False
    for ch in text:
        if inside:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                inside = False
        elif ch == '"':
            inside = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def load_json(path: str | os.PathLike, what: str = "a JSON file"):
    """The value of the JSON file ``path`` (see the module docstring for what is refused)."""
    path = Path(path)
    with os.fdopen(open_regular(path, what), "rb") as fh:
        data = fh.read(MAX_JSON_BYTES + 1)
    if len(data) > MAX_JSON_BYTES:
        raise InputError(f"{path}: larger than {MAX_JSON_BYTES >> 20} MiB, not {what}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not {what} (not UTF-8 text: {exc.reason} at byte {exc.start})") from None
    if _depth(text) > MAX_DEPTH:
        raise InputError(f"{path}: not {what} (nested deeper than {MAX_DEPTH} levels)")
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_int=_integer)
    except ValueError as exc:   # JSONDecodeError included
        raise InputError(f"{path}: not {what} ({exc})") from None
