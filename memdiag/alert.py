"""Alert rules over the counter topic's rollups: parsing and evaluation, pure.

A rule reads ``EXPR OP NUMBER [for DURATION]``:

    followup_rate > 0.3 for 5m
    rate(memdiag.dead_letter_total{reason=not_json}) > 0.5 for 10m
    ratio(retrieval_feedback_total{signal=ignored}, retrieval_feedback_total) >= 0.8
    count(misleading_observation_total) > 0 for 1h

``EXPR`` is an alias (see :data:`ALIASES`), ``count(S)`` (the sum over the window),
``rate(S)`` (per second over the window) or ``ratio(S1, S2)`` (sum of S1 over sum of S2; no
value while S2 is 0); these three take ``by ATTR[, ATTR...]``: the rule is then
evaluated apart for each value of those attributes seen in the window, and fires and
resolves for each apart (``ratio(recall_probe_total{hit=false}, recall_probe_total) by
agent_id > 0.5``: each agent whose probes mostly miss).
A series ``S`` is a counter name (``agentmemory.`` and ``agentmemory.smart_search.`` may be
left out) with optional ``{attr=value, ...}`` filters; without filters it sums every
attribute set. ``S - T - ...`` subtracts other
series from it: a counter net of what was taken back, as ``ignored_share`` is
(``retrieval_feedback_total`` less ``retrieval_feedback_retracted_total``). ``for DURATION``
is the window (``5m`` by default), in event time: it ends at the newest minute any rollup
has reached.
A rule fires when the condition starts to hold and resolves when it stops.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from memdiag.contract import (
    COUNTER_ATTRIBUTES,
    COUNTER_HELP,
    DEAD_LETTERS,
    FEEDBACK,
    FEEDBACK_RETRACTED,
    FOLLOWUPS,
    MISLEADING,
    READER_FAILURES,
    RECALL_PROBES,
    RETRIEVAL_FAILURES,
    SEARCH_CALLS,
    UNINDEXED_MEMORIES,
    pages,
)
from memdiag.contract.envelope import MINUTE_US
from memdiag.schemas.models import format_ts

OPS = {
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}
ALIASES = {
    "followup_rate": f"ratio({FOLLOWUPS}, {SEARCH_CALLS}{{source=agent}})",
    # the verdicts that stand: those taken back since are booked in their own minute
    "ignored_share": (
        f"ratio({FEEDBACK}{{signal=ignored}} - {FEEDBACK_RETRACTED}{{signal=ignored}}, "
        f"{FEEDBACK} - {FEEDBACK_RETRACTED})"
    ),
    "reader_failures": f"count({READER_FAILURES})",
    "retrieval_failures": f"count({RETRIEVAL_FAILURES})",
    "misleading": f"count({MISLEADING})",
    "dead_letters": f"count({DEAD_LETTERS})",
    # any agent's unindexed_memory_total grew within the window
    "pipeline_coverage": f"count({UNINDEXED_MEMORIES})",
    # per agent: the share of its probes in the window that missed
    "recall_probe_miss": f"ratio({RECALL_PROBES}{{hit=false}}, {RECALL_PROBES}) by agent_id",
}
#: Aliases that are a whole rule by themselves: the condition they mean when none is given
#: (``pipeline_coverage`` or ``pipeline_coverage for 10m``).
ALONE = {"pipeline_coverage": "> 0"}
_ALONE = re.compile(r"^\s*(?P<alias>\w+)(?P<window>\s+for\s+\d+\s*[smh])?\s*$")
_RULE = re.compile(
    r"^\s*(?P<expr>.+?)\s*(?P<op>>=|<=|==|!=|>|<)\s*(?P<num>-?\d+(?:\.\d+)?)"
    r"(?:\s+for\s+(?P<dur>\d+)\s*(?P<unit>[smh]))?\s*$"
)
_CALL = re.compile(
    r"^(?P<fn>rate|count|ratio)\s*\((?P<args>.*)\)(?:\s+by\s+(?P<by>\w+(?:\s*,\s*\w+)*))?$"
)
_SERIES = re.compile(r"^(?P<name>[A-Za-z_][\w.]*)\s*(?:\{(?P<filters>[^}]*)\})?$")
_UNIT_US = {"s": 1_000_000, "m": 60_000_000, "h": 3_600_000_000}


class RuleError(ValueError):
    """A rule that does not parse; the message says what is expected."""


@dataclass(frozen=True)
class Series:
    """A counter with filters, less the series in ``minus`` (``S - T``)."""

    name: str
    filters: tuple[tuple[str, str], ...] = ()
    minus: tuple[Series, ...] = ()

    def matches(self, name: str, attributes: dict[str, str]) -> bool:
        return name == self.name and all(attributes.get(k) == v for k, v in self.filters)


def _net(text: str) -> Series:
    """``S`` or ``S - T - ...``: split on the minus signs outside the filters' braces."""
    terms = _split_outside_braces(text, "-")
    head, *rest = (_series(t) for t in terms)
    return Series(head.name, head.filters, tuple(rest))


@dataclass(frozen=True)
class Rule:
    text: str
    fn: str  # count | rate | ratio
    series: tuple[Series, ...]
    op: str
    threshold: float
    window_us: int
    label: str = ""
    #: the attributes it is evaluated apart for (``by agent_id``); () sums every set
    by: tuple[str, ...] = ()

    @property
    def title(self) -> str:
        return self.label or self.text


def _series(text: str) -> Series:
    m = _SERIES.match(text.strip())
    if not m:
        raise RuleError(f"{text!r} is not a counter: write NAME or NAME{{attr=value}}")
    name = _resolve(m.group("name"))
    filters = []
    for part in (m.group("filters") or "").split(","):
        if not part.strip():
            continue
        if "=" not in part:
            raise RuleError(f"filter {part.strip()!r} in {text!r}: write attr=value")
        k, v = part.split("=", 1)
        filters.append((k.strip(), v.strip().strip("\"'")))
    return Series(name, tuple(filters))


def _resolve(name: str) -> str:
    for candidate in (
        name,
        f"agentmemory.{name}",
        f"agentmemory.smart_search.{name}",
        f"memdiag.{name}",
    ):
        if candidate in COUNTER_HELP:
            return candidate
    known = ", ".join(sorted(COUNTER_HELP))
    raise RuleError(f"unknown counter {name!r}; the counters are: {known}")


def parse_rule(text: str, label: str = "") -> Rule:
    alone = _ALONE.match(text)
    if alone and alone.group("alias") in ALONE:
        text = f"{alone.group('alias')} {ALONE[alone.group('alias')]}{alone.group('window') or ''}"
    m = _RULE.match(text)
    if m and m.group("expr").strip() in ALONE:
        op, n = m.group("op"), float(m.group("num"))
        if op not in (">", ">=") or (op == ">" and n < 0) or (op == ">=" and n <= 0):
            raise RuleError(
                f"{m.group('expr').strip()} counts the memories that missed their index "
                "deadline within the window, so it fires on more of them (and with "
                f"{op} {m.group('num')} it would always, or never, hold): write it alone, or "
                "with > N (N >= 0)"
            )
    if not m:
        raise RuleError(
            f"cannot read rule {text!r}: write EXPR OP NUMBER [for DURATION], e.g. "
            "'followup_rate > 0.3 for 5m'"
        )
    expr = ALIASES.get(m.group("expr").strip(), m.group("expr").strip())
    call = _CALL.match(expr)
    if not call:
        aliases = ", ".join(ALIASES)
        raise RuleError(
            f"{m.group('expr')!r} is neither an alias ({aliases}) nor count(...), rate(...) "
            "or ratio(..., ...)"
        )
    fn = call.group("fn")
    args = _split_args(call.group("args"))
    if len(args) != (2 if fn == "ratio" else 1):
        raise RuleError(f"{fn}() takes {'two series' if fn == 'ratio' else 'one series'}")
    window = 5 * 60_000_000
    if m.group("dur"):
        window = int(m.group("dur")) * _UNIT_US[m.group("unit")]
    if window < MINUTE_US:
        raise RuleError("the window is at least 1m: rollups are per minute")
    by = tuple(a.strip() for a in call.group("by").split(",")) if call.group("by") else ()
    series = tuple(_net(a) for a in args)
    carried = set().union(*(COUNTER_ATTRIBUTES[s.name] for x in series for s in (x, *x.minus)))
    for attr in by:
        if attr not in carried:
            raise RuleError(
                f"by {attr}: no counter of the rule carries it; they carry: "
                + (", ".join(sorted(carried)) or "nothing")
            )
    return Rule(
        text.strip(),
        fn,
        series,
        m.group("op"),
        float(m.group("num")),
        window,
        label,
        by,
    )


def _split_args(text: str) -> list[str]:
    args = _split_outside_braces(text, ",")
    return args if args[-1].strip() else args[:-1]  # a trailing comma (or nothing) adds none


def _split_outside_braces(text: str, sep: str) -> list[str]:
    """``text`` split on ``sep`` where it is not inside a series' ``{...}`` filters."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


def parse_rules_file(text: str) -> list[Rule]:
    """One rule a line, optionally ``NAME: RULE``; ``#`` starts a comment."""
    rules = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        label = ""
        head, sep, rest = line.partition(":")
        if sep and re.fullmatch(r"[\w .-]+", head) and not _RULE.match(head):
            label, line = head.strip(), rest.strip()
        try:
            rules.append(parse_rule(line, label))
        except RuleError as exc:
            raise RuleError(f"line {n}: {exc}") from None
    return rules


Group = tuple[tuple[str, str], ...]


@dataclass
class Alert:
    rule: Rule
    state: str  # firing | resolved
    value: float | None
    at_us: int  # the minute of event time the window ended at
    #: the attribute values it is for, in the rule's ``by`` order (``()``: not grouped)
    group: Group = ()

    def page(self) -> str:
        """The path of the ``memdiag serve`` page that shows the cause: an agent's recall page
        for an alert of one agent (a pipeline break, its probes missing), the misleading
        memories, the dead letters, the benchmark runs (of one run), else the overview."""
        group = dict(self.group)
        if group.get("agent_id"):
            return pages.agent_path(group["agent_id"])
        names = {s.name for s in self.rule.series}
        if MISLEADING in names:
            return "/#misleading"
        if DEAD_LETTERS in names:
            return "/dead-letters"
        if names & {READER_FAILURES, RETRIEVAL_FAILURES}:
            return pages.runs_path(group.get("run_id"))
        if names & {UNINDEXED_MEMORIES, RECALL_PROBES}:
            return "/#cards"  # the broken pipelines' card names and links the agents
        return "/"

    def as_dict(self, serve_url: str = "") -> dict[str, Any]:
        """The alert as ``--json`` prints it and the webhook gets it; with ``serve_url``
        (MEMDIAG_SERVE_URL), ``page``: the link to the page that shows the cause."""
        d: dict[str, Any] = {
            "rule": self.rule.title,
            "expr": self.rule.text,
            "state": self.state,
            "value": self.value,
            "threshold": self.rule.threshold,
            "window_minutes": self.rule.window_us // MINUTE_US,
            "at": format_ts(self.at_us),
        }
        if self.rule.by:
            d["group"] = dict(self.group)
        if serve_url:
            d["page"] = pages.url(serve_url, self.page())
        return d


@dataclass
class Evaluator:
    """Keeps the latest rollup per (counter, attributes, minute) and the rules' states."""

    rules: list[Rule]
    totals: dict[tuple[str, tuple[tuple[str, str], ...], int], int] = field(default_factory=dict)
    now_us: int = 0
    #: per rule, the groups firing (``()`` for a rule without ``by``)
    firing: dict[str, set[Group]] = field(default_factory=dict)

    def add(self, rollup: dict[str, Any], minute_us: int) -> None:
        attrs = tuple(sorted((rollup.get("attributes") or {}).items()))
        self.totals[(rollup["name"], attrs, minute_us)] = int(rollup["value"])
        self.now_us = max(self.now_us, minute_us)

    def values(self, rule: Rule) -> dict[Group, float | None]:
        """The rule's value over its window per group (``{(): v}`` without ``by``), from one
        pass over the window's rollups. The groups are every value of the ``by`` attributes a
        rollup of the rule's series has in the window, and those firing (so a group that goes
        quiet resolves, with no value)."""
        start = self.now_us - rule.window_us  # minutes in (start, now]
        terms = [(i, s, -1 if m else 1) for i, series in enumerate(rule.series)
                 for m, s in ((False, series), *((True, x) for x in series.minus))]  # fmt: skip
        sums: dict[Group, list[int]] = {g: [0] * len(rule.series)
                                        for g in self.firing.get(rule.text, ())}  # fmt: skip
        if not rule.by:
            sums.setdefault((), [0] * len(rule.series))
        for (name, attrs, minute), v in self.totals.items():
            if not start < minute <= self.now_us:
                continue
            a = dict(attrs)
            if rule.by:
                if not all(k in a for k in rule.by):
                    continue
                group: Group = tuple((k, a[k]) for k in rule.by)
            else:
                group = ()
            for i, series, sign in terms:
                if series.matches(name, a):
                    sums.setdefault(group, [0] * len(rule.series))[i] += sign * v
        # a net series is never below 0 (a take-back whose count was lost: a restarted
        # minute, an older version's state), and a ratio needs a positive denominator
        return {g: self._value(rule, [max(0, x) for x in s]) for g, s in sums.items()}

    @staticmethod
    def _value(rule: Rule, sums: list[int]) -> float | None:
        if rule.fn == "count":
            return float(sums[0])
        if rule.fn == "rate":
            return sums[0] / (rule.window_us / 1_000_000)
        return sums[0] / sums[1] if sums[1] else None

    def value(self, rule: Rule, group: Group = ()) -> float | None:
        """The rule's value over its window (of ``group``, for a rule with ``by``)."""
        return self.values(rule).get(group)

    def evaluate(self, forget: bool = True) -> list[Alert]:
        alerts = []
        for rule in self.rules:
            firing = self.firing.setdefault(rule.text, set())
            values = self.values(rule)
            for group in sorted(values):
                value = values[group]
                holds = value is not None and OPS[rule.op](value, rule.threshold)
                if holds != (group in firing):
                    if holds:
                        firing.add(group)
                    else:
                        firing.discard(group)
                    state = "firing" if holds else "resolved"
                    alerts.append(Alert(rule, state, value, self.now_us, group))
        if forget:
            self._forget()
        return alerts

    def replay(self) -> list[Alert]:
        """Evaluate every minute from the earliest held to the newest, in order: the alerts
        a backlog gives however its rollups interleaved (several partitions caught up at
        once arrive out of event-time order)."""
        if not self.totals:
            return []
        newest = self.now_us
        minute = min(k[2] for k in self.totals)
        alerts: list[Alert] = []
        while minute <= newest:
            self.now_us = minute
            alerts += self.evaluate(forget=False)
            minute += MINUTE_US
        self._forget()
        return alerts

    def _forget(self) -> None:
        longest = max((r.window_us for r in self.rules), default=0)
        horizon = self.now_us - longest - MINUTE_US
        for key in [k for k in self.totals if k[2] < horizon]:
            del self.totals[key]
