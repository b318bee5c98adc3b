"""``memdiag calibrate --labels FILE``: both used/ignored rules against labelled pairs, and
the similarity threshold the labels suggest (issue #39).

A labelled pair is one JSON object a line: ``memory`` and ``response`` (texts), ``used`` (did
the response use the memory, as a person judges it), and optionally ``id``, ``kind`` (any
label: exact, paraphrase, partial, topical, contradicted, unrelated in memdiag's own set,
``tests/data/used_pairs.jsonl``) and ``split`` (``tune`` or ``test``; none: ``tune``).

The keyword rule is the contract's (section 3: more than 30% of the memory's keywords in
the response). The semantic rule is ``used`` when the keyword rule says so **or** the
similarity (:mod:`memdiag.semantic`) reaches the threshold. The threshold is chosen on the
``tune`` pairs only: every threshold from 0.00 to 1.00 in steps of 0.01, the best F1 of
``used``, the higher threshold on a tie (fewer ``used`` verdicts for the same F1). The
``test`` pairs then say how both rules do on pairs the choice never saw.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from statistics import median
from typing import Any

import orjson

from memdiag.contract.words import is_used, keywords, response_words

TUNE, TEST = "tune", "test"
STEPS = 100  # thresholds 0.00, 0.01, ..., 1.00


class LabelsError(ValueError):
    """The labels file cannot be read: the message says where and why."""


def load(path: Path) -> list[dict[str, Any]]:
    """The labelled pairs of a JSON-lines file, each checked (line numbers in errors)."""
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise LabelsError(f"cannot read the labels file {path}: {exc.strerror or exc}") from None
    pairs = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            pair = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise LabelsError(f"{path}:{n}: not JSON ({exc})") from None
        if not isinstance(pair, dict):
            raise LabelsError(f"{path}:{n}: expected a JSON object a line")
        for field, kind in (("memory", str), ("response", str), ("used", bool)):
            if not isinstance(pair.get(field), kind):
                raise LabelsError(
                    f"{path}:{n}: '{field}' must be a {kind.__name__} "
                    '(a line is {"memory": ..., "response": ..., "used": true})'
                )
        split = pair.setdefault("split", TUNE)
        if split not in (TUNE, TEST):
            raise LabelsError(f"{path}:{n}: 'split' must be {TUNE!r} or {TEST!r}, not {split!r}")
        pair.setdefault("id", f"line {n}")
        pair.setdefault("kind", None)
        pairs.append(pair)
    if not pairs:
        raise LabelsError(f"{path} holds no labelled pair")
    return pairs


def keyword_used(memory: str, response: str) -> bool:
    """The contract's keyword rule (section 3)."""
    kws = keywords(memory)
    return is_used(len(kws & response_words(response)), len(kws))


def scores(tp: int, fp: int, fn: int, tn: int) -> dict[str, Any]:
    """Precision, recall and F1 of ``used`` (None where undefined), with the counts."""
    precision = tp / (tp + fp) if tp + fp else None
    recall = tp / (tp + fn) if tp + fn else None
    f1 = (2 * tp / (2 * tp + fp + fn)) if tp else (0.0 if fp + fn else None)
    return {"precision": precision, "recall": recall, "f1": f1,
            "tp": tp, "fp": fp, "fn": fn, "tn": tn}  # fmt: skip


def confusion(said: Iterable[bool], truth: Iterable[bool]) -> dict[str, Any]:
    tp = fp = fn = tn = 0
    for s, t in zip(said, truth, strict=True):
        tp += s and t
        fp += s and not t
        fn += t and not s
        tn += not s and not t
    return scores(tp, fp, fn, tn)


def evaluate(
    pairs: list[dict[str, Any]], similarity: Callable[[str, str], float]
) -> dict[str, Any]:
    """Both rules on the pairs; ``similarity(memory, response)`` is the semantic rule's."""
    rows = [
        {**p, "keyword": keyword_used(p["memory"], p["response"]),
         "similarity": similarity(p["memory"], p["response"])}
        for p in pairs
    ]  # fmt: skip
    tune = [r for r in rows if r["split"] == TUNE]
    test = [r for r in rows if r["split"] == TEST]
    if not tune:
        raise LabelsError(
            "every pair is a test pair: mark some 'split': 'tune' (or leave split out) to "
            "choose the threshold on pairs the test does not score"
        )

    def semantic(rs: list[dict[str, Any]], t: float) -> dict[str, Any]:
        return confusion((r["keyword"] or r["similarity"] >= t for r in rs),
                         (r["used"] for r in rs))  # fmt: skip

    sweep = [{"threshold": i / STEPS, **semantic(tune, i / STEPS)} for i in range(STEPS + 1)]
    best = max(sweep, key=lambda s: (s["f1"] or 0.0, s["threshold"]))
    chosen = best["threshold"]
    kinds: dict[str, dict[str, Any]] = {}
    for r in rows:
        k = kinds.setdefault(str(r["kind"]), {"kind": r["kind"], "pairs": 0, "used": 0,
                                                "keyword_right": 0, "semantic_right": 0,
                                                "similarities": []})  # fmt: skip
        k["pairs"] += 1
        k["used"] += r["used"]
        k["keyword_right"] += r["keyword"] == r["used"]
        k["semantic_right"] += (r["keyword"] or r["similarity"] >= chosen) == r["used"]
        k["similarities"].append(r["similarity"])
    for k in kinds.values():
        sims = sorted(k.pop("similarities"))
        k["similarity"] = {"min": sims[0], "median": median(sims), "max": sims[-1]}
    return {
        "pairs": len(rows),
        "tune_pairs": len(tune),
        "test_pairs": len(test),
        "threshold": chosen,
        "tune": {
            "keyword": confusion((r["keyword"] for r in tune), (r["used"] for r in tune)),
            "semantic": semantic(tune, chosen),
        },  # fmt: skip
        "test": None
        if not test
        else {
            "keyword": confusion((r["keyword"] for r in test), (r["used"] for r in test)),
            "semantic": semantic(test, chosen),
        },
        "sweep": sweep,
        "kinds": list(kinds.values()),
        "pairs_scored": [
            {
                "id": r["id"],
                "kind": r["kind"],
                "split": r["split"],
                "used": r["used"],
                "keyword": r["keyword"],
                "similarity": r["similarity"],
            }
            for r in rows
        ],  # fmt: skip
    }
