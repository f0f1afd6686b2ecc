"""What agents send, made storable on every database before anything reads it.

Much of an agent's message is written by trial code (log lines, error tails, evaluation
metrics, metric names), which is not trusted. PostgreSQL refuses NUL in text and
non-finite numbers in JSON, and one such value used to fail a whole write (and with it
other jobs' reports and every agent's heartbeat). So each message is scrubbed once, where
it enters the scheduler: NUL in any string becomes U+FFFD (what undecodable bytes already
become), and a non-finite value in a number map (evaluation or exit metrics) is dropped.
Scalar numbers keep their meaning-specific checks (`service.metric_rows`).
"""

from __future__ import annotations

import functools
import math
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

REPLACEMENT = "\ufffd"
_STRING = FieldDescriptor.TYPE_STRING
_DOUBLE_TYPES = (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT)


def scrub(message: Message) -> int:
    """Scrub `message` in place (see the module); returns how many values it changed."""
    changed = 0
    for field, value in message.ListFields():
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            changed += _scrub_map(field, value)
        elif field.type == _STRING:
            if field.is_repeated:
                for index, text in enumerate(value):
                    if "\0" in text:
                        value[index] = _clean(text)
                        changed += 1
            elif "\0" in value:
                setattr(message, field.name, _clean(value))
                changed += 1
        elif field.type == FieldDescriptor.TYPE_MESSAGE and _holds_text(field.message_type):
            children = value if field.is_repeated else [value]
            changed += sum(scrub(child) for child in children)
    return changed


@functools.cache
def _holds_text(descriptor: Descriptor) -> bool:
    """Whether messages of this type can hold a string or a map, at any depth: the
    thousands of iteration records a second hold neither and are not walked."""
    return any(
        field.type == _STRING
        or (
            field.type == FieldDescriptor.TYPE_MESSAGE
            and (field.message_type.GetOptions().map_entry or _holds_text(field.message_type))
        )
        for field in descriptor.fields
    )


def _scrub_map(field: FieldDescriptor, entries: Any) -> int:
    """Scalar-valued maps only: agent.proto has no map of messages."""
    value_type = field.message_type.fields_by_name["value"].type
    changed = 0
    for key, value in list(entries.items()):
        keep = value_type not in _DOUBLE_TYPES or math.isfinite(value)
        clean_key = _clean(key) if isinstance(key, str) else key
        clean_value = _clean(value) if value_type == _STRING else value
        if keep and (clean_key, clean_value) == (key, value):
            continue
        changed += 1
        del entries[key]
        if keep:
            entries[clean_key] = clean_value
    return changed


def _clean(text: str) -> str:
    return text.replace("\0", REPLACEMENT)
