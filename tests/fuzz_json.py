"""JSON inputs for the command-line fuzzer (tests/fuzz_cli.py): the mutations of a JSON document (a tolerance
file, the reference manifest) and the tolerances surface, ``ntpref compare --tolerances`` with a mutated one."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from ntpref.jsonio import MAX_JSON_BYTES

from fuzz_common import Fixtures, Result, _call, _result, classify
from fuzz_npz import f_append, f_flip, f_prepend, f_truncate
from fuzz_outputs import OUTPUTS


# ---- JSON inputs: tolerance files and the reference manifest ----------------------------------------------

class Pairs(list):
    """A JSON object given as its (key, value) pairs, written in order, so that a key can appear twice."""


class Raw(str):
    """JSON text written as it is: a number no float holds (1e400), a 31-digit integer, a deep nesting."""


def json_text(value) -> str:
    """``value`` as JSON text (ASCII; NaN and Infinity as Python's json writes and reads them)."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, (dict, Pairs)):
        pairs = value.items() if isinstance(value, dict) else value
        return "{" + ", ".join(f"{json.dumps(str(k))}: {json_text(v)}" for k, v in pairs) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(json_text(v) for v in value) + "]"
    return json.dumps(value)


def _paths(value, at=()):
    """The path (keys and indices) of every node of a JSON value, the root's () first; Pairs and Raw are leaves."""
    yield at
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, at + (k,))
    elif isinstance(value, list) and not isinstance(value, Pairs):
        for i, v in enumerate(value):
            yield from _paths(v, at + (i,))


def _get(value, path):
    for key in path:
        value = value[key]
    return value


def _put(value, path, new):
    """A copy of ``value`` with the node at ``path`` replaced by ``new`` (only the nodes along the path copied)."""
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = _put(value[path[0]], path[1:], new)
    return copy


BAD_VALUES = ("text", "", None, True, False, [], {}, [1e-10], {"rtol": 1e-10}, 0, 1)
NUMBERS = (math.nan, math.inf, -math.inf, -1, -1e-300, -0.0, 0.0, 5e-324, 1e308, 10 ** 29, 2 ** 63, 1.5, True,
           Raw("1e400"), Raw("-1e400"), Raw("1e-400"), Raw("1" * 31), Raw("-" + "9" * 40))
KEYS = ("rtoll", "RTOL", "", " rtol", "default", "tolerances", "head", "n", "reason", "grad_w", "é", "\0",
        "\ud800", "format_version", "cases", "sha256", "bitwise", "files", "intermediates")


def _pick(ch, paths: list[tuple]) -> tuple:
    """One of ``paths``: a depth first, then a path of that depth (so that the few nodes near the root, such
    as a case's "provenance", are as likely to be hit as the thousands of array records)."""
    depth = ch.choice(sorted({len(p) for p in paths}))
    return ch.choice([p for p in paths if len(p) == depth])


def _objects(doc, paths):
    return [p for p in paths if isinstance(_get(doc, p), dict) and _get(doc, p)]


def j_type(doc, ch, paths):
    return _put(doc, _pick(ch, paths), ch.choice(BAD_VALUES))


def j_number(doc, ch, paths):
    numbers = [p for p in paths if type(_get(doc, p)) in (int, float)]
    return _put(doc, _pick(ch, numbers or paths), ch.choice(NUMBERS))


def j_key(doc, ch, paths):
    """An unknown (or misplaced) key added to an object."""
    where = _pick(ch, [p for p in paths if isinstance(_get(doc, p), dict)] or [()])
    node = _get(doc, where)
    if not isinstance(node, dict):
        return doc
    return _put(doc, where, {**node, ch.choice(KEYS): ch.choice(BAD_VALUES + NUMBERS[:3] + (1e-8,))})


def j_rename(doc, ch, paths):
    objects = _objects(doc, paths)
    if not objects:
        return doc
    where = _pick(ch, objects)
    node = _get(doc, where)
    old = ch.choice(list(node))
    new = ch.choice((old.upper(), old + "_", old[:-1], " " + old, old.swapcase()))
    return _put(doc, where, {(new if k == old else k): v for k, v in node.items()})


def j_remove(doc, ch, paths):
    objects = _objects(doc, paths)
    if not objects:
        return doc
    where = _pick(ch, objects)
    node = _get(doc, where)
    gone = ch.choice(list(node))
    return _put(doc, where, {k: v for k, v in node.items() if k != gone})


def j_duplicate(doc, ch, paths):
    """A key of an object written twice, with its own value or another one."""
    objects = _objects(doc, paths)
    if not objects:
        return doc
    where = _pick(ch, objects)
    node = _get(doc, where)
    key = ch.choice(list(node))
    return _put(doc, where, Pairs(list(node.items()) + [(key, ch.choice((node[key], 1e-8, None)))]))


def j_deep(doc, ch, paths):
    """A node replaced by a nesting of arrays or objects around the limit, or far over it."""
    depth = ch.choice((60, 63, 64, 65, 300, 100000))
    text = ch.choice(("[" * depth + "]" * depth, '{"a": ' * depth + "{}" + "}" * depth))
    return _put(doc, _pick(ch, paths), Raw(text))


def j_long(doc, ch, paths):
    return _put(doc, _pick(ch, paths), "x" * ch.choice((1000, 1 << 20)))


def j_wrap(doc, ch, paths):
    """The document inside a list or a "tolerances" object, or one of its nodes as the whole document."""
    op = ch.choice(("list", "tolerances", "node"))
    return [doc] if op == "list" else {"tolerances": doc} if op == "tolerances" else _get(doc, _pick(ch, paths))


JSON_MUTATIONS = {f.__name__[2:]: f for f in (j_type, j_number, j_key, j_rename, j_remove, j_duplicate, j_deep,
                                                j_long, j_wrap)}


def t_encoding(raw, ch):
    """Text that is not UTF-8 (a Latin-1 é, a stray byte, an encoded surrogate), UTF-16, a BOM, or a NUL."""
    at = ch.integer(0, len(raw))
    op = ch.choice(("latin1", "byte", "surrogate", "utf16", "bom", "nul"))
    if op == "utf16":
        return raw.decode("ascii").encode("utf-16")
    if op == "bom":
        return b"\xef\xbb\xbf" + raw
    insert = {"latin1": b"\xe9", "byte": b"\xff", "surrogate": b"\xed\xa0\x80", "nul": b"\0"}[op]
    return raw[:at] + insert + raw[at:]


def t_size(raw, ch):
    """An empty or blank file, or one padded with spaces to the size limit exactly or one byte beyond it."""
    op = ch.choice(("empty", "blank", "limit", "over"))
    if op in ("empty", "blank"):
        return b"" if op == "empty" else b" \n\t "
    return raw + b" " * (MAX_JSON_BYTES - len(raw) + (op == "over"))


BYTE_MUTATIONS = {"flip": f_flip, "truncate": f_truncate, "append": f_append, "prepend": f_prepend,
                  "encoding": t_encoding, "size": t_size}


def mutate_json(doc, ch, within: tuple = ()) -> tuple[bytes, list[str]]:
    """The bytes of ``doc`` after one to four mutations (value-level, then maybe a byte-level one), and their
    names; half of the value mutations pick a node under the path ``within``."""
    steps = []
    for _ in range(ch.integer(0 if ch.integer(0, 2) == 0 else 1, 3)):
        paths = list(_paths(doc))
        if within and ch.integer(0, 1):
            paths = [p for p in paths if p[:len(within)] == within] or paths
        name = ch.choice(sorted(JSON_MUTATIONS))
        doc = JSON_MUTATIONS[name](doc, ch, paths)
        steps.append("json:" + name)
    raw = json_text(doc).encode()
    if not steps or ch.integer(0, 3) == 0:
        name = ch.choice(sorted(BYTE_MUTATIONS))
        raw = BYTE_MUTATIONS[name](raw, ch)
        steps.append("bytes:" + name)
    return raw, steps


#: The awkward paths of OUTPUTS that an output must refuse: as inputs they must be refused too.
AWKWARD = sorted(kind for kind, (_, check) in OUTPUTS.items() if check is None)


def _json_file(raw: bytes, ch, d: Path) -> tuple[str, str]:
    """(path, kind) of the JSON input in the empty folder ``d``: usually a file holding ``raw``, else a symbolic
    link to one, or an awkward path of OUTPUTS (a FIFO, a directory, ...), or no file at all."""
    kind = ch.choice(("link", "missing", *AWKWARD)) if ch.integer(0, 4) == 0 else "file"
    if kind in AWKWARD:
        return OUTPUTS[kind][0](d), kind
    path = d / "tolerances.json"
    if kind == "link":
        (d / "target.json").write_bytes(raw)
        os.symlink("target.json", path)
    elif kind == "file":
        path.write_bytes(raw)
    return str(path), kind


def tolerance_run(ch, fx: Fixtures) -> Result:
    base = ch.choice(sorted(fx.tolerance_files))
    raw, steps = mutate_json(fx.tolerance_files[base], ch)
    path, kind = _json_file(raw, ch, fx.fresh("json"))
    actual = ch.choice((fx.expected, fx.perturbed))
    rc, _, err = _call(["compare", fx.expected, actual, "--tolerances", path])
    outcome, why = classify(rc, err)
    return _result(f"compare --tolerances {base} " + "+".join(steps), steps + [f"place:{kind}"], rc, err, why, outcome)
