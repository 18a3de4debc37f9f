"""The repository's stored reference runs as the tests of verify, regen, export and the bit-identical
promises use them: where they are, the cases they name, and the helpers that damage or edit a private copy
(the ``runs`` and ``manifest`` fixtures are in tests/conftest.py)."""
import json
import struct
import zipfile
from pathlib import Path

import make_reference_runs
from ntpref.oracle import manifest as mf

REPO_RUNS = Path(mf.__file__).resolve().parents[2] / "reference_runs"
EVAL_CASE = "twostage_eval_onehot_succ"
#: The stored cases the models' specifications define (ntpref/twostage/cases.py, ntpref/shallow/cases.py).
SPEC_CASES = {c.name for c in make_reference_runs.CASES}


def layout(path: Path) -> dict:
    """Byte offsets inside an uncompressed npz: per member its local header, npy header and raw data,
    and its central directory record."""
    raw = path.read_bytes()
    out = {}
    with zipfile.ZipFile(path) as zf:
        central = zf.start_dir
        for info in zf.infolist():
            h = info.header_offset
            n, extra = struct.unpack("<HH", raw[h + 26:h + 30])
            data = h + 30 + n + extra
            hlen = struct.unpack("<H", raw[data + 8:data + 10])[0]
            cd = raw.index(b"PK\x01\x02", central)
            out[info.filename[:-4]] = {"local": h, "name": h + 30, "npy_header": data + 10, "data": data + 10 + hlen,
                                       "end": data + info.file_size, "central": cd}
            central = cd + 4
    return out


def flip(path: Path, pos: int) -> None:
    """Change the byte at ``pos`` of the file (XOR 0x5A)."""
    raw = bytearray(path.read_bytes())
    raw[pos] ^= 0x5A
    path.write_bytes(bytes(raw))


def edit_manifest(root: Path, edit) -> None:
    """Rewrite ROOT/manifest.json with ``edit`` applied to its parsed contents."""
    data = json.loads((root / "manifest.json").read_text())
    edit(data)
    (root / "manifest.json").write_text(json.dumps(data))
