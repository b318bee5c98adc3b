"""Whole words against substrings: how many used/ignored verdicts the AgentOS reading flips.

memdiag matches a memory's keywords to the response's *whole* normalised words (contract
section 3); AgentOS counts a keyword as matched wherever it occurs in the lowercased response
(``response.toLowerCase().includes(keyword)``). Same keywords, same 30% threshold; only the
matching differs (docs/rules.md, "Whole words, not substrings"). The two readings disagree
both ways:

- ``ignored`` -> ``used``: a keyword inside a longer word ("deploy" in "deployment", "state"
  in "statement") counts only as a substring;
- ``used`` -> ``ignored``: a keyword normalised from punctuated text ("authtoken" from
  "auth-token") is a whole word of a response that says "auth-token", but not a substring of
  its raw text.

DuckDB keeps no memory contents nor response texts, so the texts are read where the user
has them: the events file the runtime published (``memdiag calibrate --events FILE``). The
turns are joined as the stream joins them (docs/rules.md, "Used / ignored"): a turn
``(session_id, turn_id)`` is judged against its *first* response in event time (``ts``, ties
by ``event_id``); every injection of the turn counts, and each distinct observation once,
with the content of its first injection in event time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from memdiag.contract.words import is_used, keywords, response_words

#: flipped verdicts shown as examples
EXAMPLES = 5


@dataclass(frozen=True, slots=True)
class Reading:
    used_words: bool
    used_substrings: bool
    only_substring: tuple[str, ...]  # keywords found as substrings, not as words
    only_word: tuple[str, ...]  # keywords found as words, not as substrings


def read_both(content: str, response: str) -> Reading:
    """Both readings of one (memory, response): memdiag's and AgentOS's."""
    kws = keywords(content)
    words = response_words(response)
    raw = response.lower()
    as_word = {k for k in kws if k in words}
    as_sub = {k for k in kws if k in raw}
    return Reading(
        is_used(len(as_word), len(kws)),
        is_used(len(as_sub), len(kws)),
        tuple(sorted(as_sub - as_word)),
        tuple(sorted(as_word - as_sub)),
    )


def _when(event: dict[str, Any]) -> tuple[datetime, str] | None:
    """An event's order in event time: its ``ts``, ties by ``event_id``; None when unreadable."""
    ts, eid = event.get("ts"), event.get("event_id")
    if not isinstance(ts, str) or not isinstance(eid, str):
        return None
    try:
        when = datetime.fromisoformat(ts)
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)), eid


def _first(current: dict[str, Any] | None, event: dict[str, Any]) -> dict[str, Any]:
    """The earlier of two events in event time (``current`` on a tie of both keys)."""
    if current is None:
        return event
    a, b = _when(event), _when(current)
    return event if a is not None and b is not None and a < b else current


def turns(
    lines: Iterable[bytes],
) -> tuple[Iterator[tuple[str, str, dict[str, str], dict[str, Any]]], dict[str, int]]:
    """The turns of an events file: (session, turn, its observations as id -> content, its
    response), and what was skipped (lines that are not JSON objects, events without a
    readable ``ts`` and ``event_id``, turns with one half only)."""
    injections: dict[tuple[str, str], list[dict[str, Any]]] = {}
    responses: dict[tuple[str, str], dict[str, Any]] = {}
    skipped = {"not_json": 0, "bad_ts": 0, "unpaired_turns": 0}
    for line in lines:
        if not line.strip():
            continue
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError:
            skipped["not_json"] += 1
            continue
        if not isinstance(event, dict):
            skipped["not_json"] += 1
            continue
        kind, session, turn = event.get("kind"), event.get("session_id"), event.get("turn_id")
        if not isinstance(session, str) or not isinstance(turn, str):
            continue
        if kind not in ("injection", "response"):
            continue
        if _when(event) is None:
            skipped["bad_ts"] += 1
            continue
        if kind == "injection":
            injections.setdefault((session, turn), []).append(event)
        else:
            responses[(session, turn)] = _first(responses.get((session, turn)), event)
    both = sorted(injections.keys() & responses.keys())
    skipped["unpaired_turns"] = len(injections.keys() ^ responses.keys())
    return ((s, t, _contents(injections[(s, t)]), responses[(s, t)]) for s, t in both), skipped


def _contents(injections: list[dict[str, Any]]) -> dict[str, str]:
    """Each distinct observation of a turn's injections, with the content of its first
    injection in event time."""
    out: dict[str, str] = {}
    for inj in sorted(injections, key=lambda e: _when(e) or (datetime.max.replace(tzinfo=UTC), "")):
        observations = inj.get("observations")
        for o in observations if isinstance(observations, list) else ():
            if isinstance(o, dict) and isinstance(o.get("id"), str):
                if isinstance(o.get("content"), str) and o["id"] not in out:
                    out[o["id"]] = o["content"]
    return out


def substring_flips(path: str | Path) -> dict[str, Any]:
    """How the verdicts of an events file's turns read under both matchings."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            pairs, skipped = turns(f)
            judged = used_w = used_s = up = down = 0
            examples: list[dict[str, Any]] = []
            for session, turn, observations, response in pairs:
                text = response.get("text")
                if not isinstance(text, str):
                    continue
                for observation_id, content in observations.items():
                    r = read_both(content, text)
                    judged += 1
                    used_w += r.used_words
                    used_s += r.used_substrings
                    if r.used_words == r.used_substrings:
                        continue
                    up += r.used_substrings
                    down += r.used_words
                    if len(examples) < EXAMPLES:
                        examples.append({
                            "session_id": session, "turn_id": turn,
                            "observation_id": observation_id,
                            "whole_words": "used" if r.used_words else "ignored",
                            "substrings": "used" if r.used_substrings else "ignored",
                            "only_as_substring": list(r.only_substring),
                            "only_as_word": list(r.only_word),
                        })  # fmt: skip
    except OSError as exc:
        raise FileNotFoundError(f"cannot read the events file {str(p)!r}: {exc.strerror}") from None
    return {
        "source": str(p),
        "judged": judged,
        "used_whole_words": used_w,
        "used_substrings": used_s,
        "ignored_to_used": up,
        "used_to_ignored": down,
        "flipped_share": (up + down) / judged if judged else None,
        "examples": examples,
        "skipped": skipped,
    }


#: Thresholds :func:`semantic_reading` also counts the flips at (the configured one is added).
THRESHOLDS = (0.1, 0.15, 0.19, 0.25, 0.3, 0.4, 0.5)
#: characters of a memory an example shows
EXCERPT = 120


def semantic_reading(
    path: str | Path, threshold: float, similar: Callable[[str, str], float]
) -> dict[str, Any]:
    """What the semantic rule (``MEMDIAG_DETECTOR=semantic``) would make of an events file's
    turns: each (memory, response) keeps its keyword verdict and gains ``similar(memory,
    response)``; the signal is ``used`` when the keyword rule says so or the similarity
    reaches ``threshold`` (contract section 3). Counts the verdicts it turns from ignored to
    used, at ``threshold`` and at :data:`THRESHOLDS`, and the similarity's distribution over
    the pairs the keyword rule calls used and over those it calls ignored; the examples are
    the flips with the lowest similarity, the ones to read before trusting the threshold."""
    import numpy as np

    from memdiag.analytics.calibrate import QUANTILES, spread

    p = Path(path)
    kept: list[tuple[bool, float]] = []
    flips: list[tuple[float, dict[str, Any]]] = []
    try:
        with p.open("rb") as f:
            pairs, skipped = turns(f)
            for session, turn, observations, response in pairs:
                text = response.get("text")
                if not isinstance(text, str):
                    continue
                words = response_words(text)
                for observation_id, content in observations.items():
                    kws = keywords(content)
                    by_words = is_used(sum(k in words for k in kws), len(kws))
                    sim = similar(content, text)
                    kept.append((by_words, sim))
                    if not by_words and sim >= threshold:
                        flips.append((sim, {
                            "session_id": session, "turn_id": turn,
                            "observation_id": observation_id, "similarity": sim,
                            "memory": content[:EXCERPT] + ("…" if len(content) > EXCERPT else ""),
                        }))  # fmt: skip
    except OSError as exc:
        raise FileNotFoundError(f"cannot read the events file {str(p)!r}: {exc.strerror}") from None

    def summary(values: list[float]) -> dict[str, Any]:
        if not values:
            return spread(0, None, None, None)
        qs = np.percentile(np.array(values), [q * 100 for _, q in QUANTILES]).tolist()
        return spread(len(values), min(values), qs, max(values))

    ignored = [s for used, s in kept if not used]
    flipped = sum(s >= threshold for s in ignored)
    return {
        "source": str(p),
        "threshold": threshold,
        "judged": len(kept),
        "used_keyword": len(kept) - len(ignored),
        "used_semantic": len(kept) - len(ignored) + flipped,
        "ignored_to_used": flipped,
        "flipped_share": flipped / len(kept) if kept else None,
        "similarity": {
            "keyword_used": summary([s for used, s in kept if used]),
            "keyword_ignored": summary(ignored),
        },
        "at_thresholds": [
            {"threshold": t, "ignored_to_used": sum(s >= t for s in ignored)}
            for t in sorted({*THRESHOLDS, threshold})
        ],
        "examples": [e for _, e in sorted(flips, key=lambda x: x[0])[:EXAMPLES]],
        "skipped": skipped,
    }
