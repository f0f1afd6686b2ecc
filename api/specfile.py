"""Reading a job spec file (JSON for `.json`, YAML otherwise) into plain data, strictly.

What the parsers let through silently is refused by name: a key given twice in one
mapping (both keep the last), NUL characters, nesting deeper than any spec needs, and
input nested deep enough to exhaust the parser's recursion. YAML is read with YAML 1.2's
booleans and floats, so `spb: off` stays a string and `learning_rate: 1e-3` is a number
(the spec's types are strict: a string where a number belongs is refused, not coerced).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode

from api import strict_json


class SpecFileError(ValueError):
    """The file cannot be read or parsed; the message says where and why."""


_BOOL_TAG = "tag:yaml.org,2002:bool"
_FLOAT_TAG = "tag:yaml.org,2002:float"
# YAML 1.2 core schema floats: YAML 1.1 (PyYAML) wants a dot, so `1e-3` were a string.
_FLOAT = re.compile(
    r"""^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
    |[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.VERBOSE,
)


class _SpecLoader(yaml.SafeLoader):
    """YAML 1.2 booleans and floats; a key given twice in a mapping is an error."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<` merges are meant to be overridden
            key = self.construct_object(key_node, deep=deep)
            try:
                if key in seen:
                    raise ConstructorError(
                        "while reading a mapping",
                        node.start_mark,
                        f"duplicate key {key!r}",
                        key_node.start_mark,
                    )
                seen.add(key)
            except TypeError:
                pass  # an unhashable key: the base constructor says so
        return super().construct_mapping(node, deep=deep)


_SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_BOOL_TAG, _FLOAT_TAG)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_SpecLoader.add_implicit_resolver(
    _BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_SpecLoader.add_implicit_resolver(_FLOAT_TAG, _FLOAT, list("-+0123456789."))


def read_spec_file(path: Path) -> Any:
    """The parsed file, or SpecFileError."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecFileError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecFileError(f"{path}: cannot read: {exc}") from None
    try:
        data = _parse(path, text)
    except RecursionError:
        raise SpecFileError(f"{path}: {strict_json.TOO_DEEP}") from None
    problems = strict_json.problems(data)
    if problems:
        listed = "; ".join(f"{p['loc']}: {p['message']}" for p in problems[:5])
        raise SpecFileError(f"{path}: {listed}")
    return data


def _parse(path: Path, text: str) -> Any:
    if path.suffix.lower() == ".json":
        try:
            return json.loads(text, object_pairs_hook=strict_json.object_pairs)
        except json.JSONDecodeError as exc:
            raise SpecFileError(
                f"{path}: not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
            ) from None
    try:
        return yaml.load(text, Loader=_SpecLoader)
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" (line {mark.line + 1}, column {mark.column + 1})"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecFileError(f"{path}: not valid YAML: {problem}{where}") from None
