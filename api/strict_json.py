"""JSON read strictly: what `json.loads` lets through silently is refused by name.

`json.loads` keeps the last of a key given twice, accepts NUL characters in strings
(which PostgreSQL text cannot hold) and recurses as deep as the input nests. Request
bodies (api/guards.py) and the CLI's spec files go through `problems` instead.
"""

from __future__ import annotations

import json
from typing import Any

# Far deeper than any request body or job spec nests (a job spec: 3 levels).
MAX_DEPTH = 32
NUL_MESSAGE = "must not contain NUL characters"
TOO_DEEP = f"nested deeper than {MAX_DEPTH} levels"


class _Object(dict[str, Any]):
    """A JSON object that remembers the keys it was given more than once."""

    duplicates: tuple[str, ...] = ()


def object_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`object_pairs_hook` for json.loads: a dict that `problems` can check for
    duplicate keys."""
    obj = _Object(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        repeated = []
        for key, _ in pairs:
            if key in seen:
                repeated.append(key)
            seen.add(key)
        obj.duplicates = tuple(repeated)
    return obj


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def problems(value: Any) -> list[dict[str, str]]:
    """The NUL characters, duplicate keys and excess nesting in a JSON document parsed
    with `object_pairs_hook=object_pairs`, each `{"loc": field path, "message"}`."""
    found: list[dict[str, str]] = []
    stack: list[tuple[str, Any, int]] = [("", value, 1)]
    while stack:
        path, item, depth = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                found.append({"loc": path or "body", "message": NUL_MESSAGE})
            continue
        if not isinstance(item, dict | list):
            continue
        if depth > MAX_DEPTH:
            found.append({"loc": path or "body", "message": TOO_DEEP})
            continue
        if isinstance(item, list):
            stack.extend((_join(path, i), child, depth + 1) for i, child in enumerate(item))
            continue
        for key in getattr(item, "duplicates", ()):
            found.append({"loc": _join(path, key), "message": f"duplicate key {key!r}"})
        for key, child in item.items():
            if "\x00" in key:
                found.append({"loc": path or "body", "message": f"a key {NUL_MESSAGE}"})
                continue
            stack.append((_join(path, key), child, depth + 1))
    return found


def problems_in(text: str | bytes) -> list[dict[str, str]] | None:
    """`problems` of a JSON text; None when it is not JSON at all (its parser says why)."""
    try:
        value = json.loads(text, object_pairs_hook=object_pairs)
    except RecursionError:
        return [{"loc": "body", "message": TOO_DEEP}]
    except ValueError:
        return None
    return problems(value)
