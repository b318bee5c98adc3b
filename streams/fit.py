"""An output record made to fit in one Kafka message.

Every output is one record of a few hundred bytes, except where it carries what a producer
sent without a bound on the whole: a ``session_diagnostic`` holds its outcome's
``failure_context`` (up to ``MEMDIAG_MAX_EVENT_BYTES``) and every observation, entity and
edge the session injected; a judgement's row holds its id lists. A record over the broker's
``message.max.bytes`` (1 MiB by default on Apache Kafka) is refused at every retry, and the
checkpoint that sends it never commits: the worker would stall on its partition for good.

So a record over ``MEMDIAG_MAX_OUTPUT_BYTES`` is trimmed before it is sent, its largest fields
first, until it fits: a list keeps its first items, a text its first characters, and the
free-form ``failure_context`` is replaced by the start of its JSON text; an item too large
to keep whole (an error with a long message) keeps the start of its long texts. The identity and the
counts of the record (ids, numbers, short texts) are never touched. A record that has a
``failure_context`` says what was trimmed there, under :data:`TRUNCATED`; the worker logs
every trim. The trim is a function of the record and the limit alone, so a replay trims the
same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from memdiag.contract import TRUNCATED

__all__ = ["TRUNCATED", "fit"]

Dumps = Callable[[Any], bytes]

#: the field that holds free-form JSON (a JSON column in DuckDB: the note goes there)
FREE_FORM = "failure_context"
#: texts this long or shorter are never trimmed (ids, categories, timestamps)
SHORT_TEXT = 256
#: bytes kept free for the note in ``failure_context`` (its field names and counts)
NOTE_ROOM = 2048


def fit(
    record: dict[str, Any], limit: int, dumps: Dumps = orjson.dumps, overhead: int = 0
) -> tuple[dict[str, Any], dict[str, str]]:
    """``record`` as it is when its JSON is at most ``limit - overhead`` bytes (``overhead``:
    what its message holds around it); otherwise a copy trimmed to fit and, per field
    trimmed, what was kept ("kept 120 of 40,000 items")."""
    whole = len(dumps(record))
    if whole <= limit - overhead:
        return record, {}
    budget = limit - overhead - (NOTE_ROOM if FREE_FORM in record else 0)
    sizes = {name: len(dumps(value)) for name, value in record.items() if _trimmable(name, value)}
    room = budget - (whole - sum(sizes.values()))  # what the trimmable fields may take
    cap = _cap(sorted(sizes.values()), room)
    out, notes, used = _cut_to(record, sizes, cap, dumps)
    # a field cut to whole items (or escapes) comes out under the cap: share out what the
    # cut fields left unused, while that still fits (by name and by rounds: deterministic)
    for _ in range(3):
        spare = room - used
        if not notes or spare < 256 * len(notes):
            break
        wider, wider_notes, wider_used = _cut_to(record, sizes, cap + spare // len(notes), dumps)
        if wider_used > room:
            break
        cap += spare // len(notes)
        out, notes, used = wider, wider_notes, wider_used
    for name in notes:  # a dead letter's payload says it is cut where it already can
        if isinstance(out.get(f"{name}_truncated"), bool):
            out[f"{name}_truncated"] = True
    if notes and FREE_FORM in out:
        note = {"bytes": whole, "limit": limit, "fields": notes}
        out[FREE_FORM] = {TRUNCATED: note, FREE_FORM: out[FREE_FORM]}
    return out, notes


def _cut_to(
    record: dict[str, Any], sizes: dict[str, int], cap: int, dumps: Dumps
) -> tuple[dict[str, Any], dict[str, str], int]:
    """``record`` with each trimmable field over ``cap`` bytes cut to it; the notes; the
    bytes the trimmable fields take then."""
    out = dict(record)
    notes: dict[str, str] = {}
    used = 0
    for name in sorted(sizes):  # by name, so the trim is the same on every run
        if sizes[name] > cap:
            out[name], notes[name] = _shrink(name, record[name], cap, dumps)
            used += len(dumps(out[name]))
        else:
            used += sizes[name]
    return out, notes, used


def _cap(sizes: list[int], room: int) -> int:
    """The largest size ``c`` such that the fields, each cut to at most ``c`` bytes, take at
    most ``room`` bytes together (``sizes`` ascending): the largest fields are cut to one
    size, so no one field loses everything to another's bulk."""
    left, n = room, len(sizes)
    for i, size in enumerate(sizes):
        share = left // (n - i)  # what each field from here on may take
        if size > share:
            return max(share, 0)
        left -= size
    return sizes[-1] if sizes else 0


def _trimmable(name: str, value: Any) -> bool:
    if name == FREE_FORM:
        return value is not None
    if isinstance(value, str):
        return len(value) > SHORT_TEXT
    return isinstance(value, list) and len(value) > 0


def _shrink(name: str, value: Any, room: int, dumps: Dumps) -> tuple[Any, str]:
    """``value`` cut to at most ``room`` bytes of JSON, and what was kept."""
    if name == FREE_FORM:  # free-form JSON: the start of its JSON text, as a text
        source = value if isinstance(value, str) else dumps(value).decode("utf-8")
        text = _cut(source, room, dumps)
        what = "characters" if isinstance(value, str) else "characters of its JSON"
        return text, f"replaced by the first {len(text):,} of {len(source):,} {what}"
    if isinstance(value, str):
        text = _cut(value, room, dumps)
        return text, f"kept {len(text):,} of {len(value):,} characters"
    kept, used = 0, 2  # the brackets
    for item in value:
        size = len(dumps(item)) + (1 if kept else 0)
        if used + size > room:
            break
        used += size
        kept += 1
    items = value[:kept]
    if kept < len(value):  # the first item that does not fit, cut inside, if it can be
        part = _part(value[kept], room - used - (1 if kept else 0), dumps)
        if part is not None:
            items.append(part)
            return items, f"kept {kept:,} of {len(value):,} items, and the start of one more"
    return items, f"kept {kept:,} of {len(value):,} items"


def _part(item: Any, room: int, dumps: Dumps) -> Any:
    """``item`` with its long texts cut so that it takes at most ``room`` bytes (an error's
    message, a long text in a list); None where nothing useful fits (an id is never cut)."""
    if room < 2 * SHORT_TEXT:
        return None
    if isinstance(item, str):
        return _cut(item, room, dumps) if len(item) > SHORT_TEXT else None
    if not isinstance(item, dict):
        return None
    texts = {
        k: len(dumps(v)) for k, v in item.items() if isinstance(v, str) and len(v) > SHORT_TEXT
    }
    if not texts:
        return None
    fixed = len(dumps(item)) - sum(texts.values())
    cap = _cap(sorted(texts.values()), room - fixed)
    if cap < SHORT_TEXT:
        return None
    part = dict(item)
    for k in sorted(texts):
        if texts[k] > cap:
            part[k] = _cut(item[k], cap, dumps)
    return part


def _cut(text: str, room: int, dumps: Dumps) -> str:
    """The longest start of ``text`` whose JSON (quotes and escapes included) fits ``room``."""
    low, high = 0, len(text)
    while low < high:  # the longest prefix that fits; escapes make it no simple slice
        mid = (low + high + 1) // 2
        if len(dumps(text[:mid])) <= room:
            low = mid
        else:
            high = mid - 1
    return text[:low]
