"""A kernel shape given on the command line: 'FIELD=N,...' or every field by position, each within its limits
(fast-tc's ``--tile-config``, the backward's ``--bwd-config``, fast-decode's ``--decode-config``)."""
from __future__ import annotations

from dataclasses import fields

from .errors import BadInput


def parse_fields(text: str, option: str, cls, limits: dict, min_positional: int) -> dict:
    """The integer fields of a shape given as 'FIELD=N,...' (any case) or all by position (at least
    ``min_positional``, the rest at the dataclass ``cls``'s defaults), each within ``limits``
    (field: (least, most, step)); BadInput naming ``option`` and the limit. fast-tc's
    ``--tile-config``, fast-decode's ``--decode-config``."""
    names = tuple(f.name for f in fields(cls))
    where = f"{option} {text!r}"
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or not all(parts):
        raise BadInput(f"{where}: expected FIELD=N,... or {','.join(names[:min_positional])}"
                       f"[,{','.join(names[min_positional:])}]")
    if all("=" not in p for p in parts):  # positional: a whole shape
        if not min_positional <= len(parts) <= len(names):
            raise BadInput(f"{where}: the positional form takes {min_positional} to {len(names)} numbers "
                           f"({','.join(names)}), got {len(parts)}")
        defaults = {f.name: f.default for f in fields(cls)}
        pairs = list(zip(names, parts)) + [(f, str(defaults[f])) for f in names[len(parts):]]
    elif all("=" in p for p in parts):
        pairs = [tuple(x.strip() for x in p.split("=", 1)) for p in parts]
    else:
        raise BadInput(f"{where}: give every field as FIELD=N, or all of them by position")
    given = {}
    for key, value in pairs:
        name = key.upper()
        if name not in limits:
            raise BadInput(f"{where}: unknown field {key!r} (fields: {', '.join(names)})")
        if name in given:
            raise BadInput(f"{where}: {name} given twice")
        try:
            v = int(value)
        except ValueError:
            raise BadInput(f"{where}: {name}={value!r} is not an integer") from None
        lo, hi, step = limits[name]
        if not lo <= v <= hi or v % step:
            limit = "0 or 1" if (lo, hi) == (0, 1) else f"{f'a multiple of {step} ' if step > 1 else ''}from {lo} to {hi}"
            raise BadInput(f"{where}: {name}={v} must be {limit}")
        given[name] = v
    return given
