"""``memdiag gate``: a release verdict on a candidate run against a baseline, by policy.

The policy (TOML) states, per metric, the largest regression allowed. A regression is judged
on the bound of the 95% paired bootstrap interval of candidate − baseline, not on the point
estimate: for a metric where higher is better (accuracy, recall, MRR, score) the lower bound
below ``-max_regression`` is a regression; for one where lower is better (latency, tokens) the
upper bound above ``+max_regression`` is. So a candidate whose point estimate improves still
fails when the data cannot rule out a regression larger than allowed: the gate asks for
evidence, not for luck.

Exit statuses (contract section 10): 0 pass, 1 a judged regression and nothing else, 2
anything else: cannot judge (too few paired questions or repeats, a different
``suite_checksum``, a metric no pair carries, no data) or an error (usage, bad policy,
unreadable database). When a metric regresses *and* another cannot be judged, the gate did not
judge the whole policy: 2, and the reason names both.

Everything here is pure but :func:`run_gate`, which reads DuckDB.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from memdiag.analytics.lookup import SameSides
from memdiag.analytics.metrics import METRICS, Metric, Paired, fmt, paired
from memdiag.analytics.scores import (
    Judged,
    Side,
    UnknownRun,
    load_side,
    same_sides,
    side,
    side_dict,
)

PASS, REGRESSION, CANNOT_JUDGE, ERROR = "pass", "regression", "cannot_judge", "error"
STATUS = {PASS: 0, REGRESSION: 1, CANNOT_JUDGE: 2, ERROR: 2}
#: what the policy may say when both runs carry one config_fingerprint
SAME_CONFIG = ("note", "refuse")
#: what it may say when the two sides carry different fixture_checksums (default: refuse)
SAME_FIXTURE = ("refuse", "note")
#: the metrics a missing token count on one side leaves unjudgeable
TOKEN_METRICS = ("tokens", "input_tokens", "output_tokens")
#: the interval the gate judges on (contract section 10): fixed, as `compare`'s default
LEVEL, RESAMPLES, SEED = 0.95, 10_000, 0


def bundled_policy() -> Path:
    """The example policy memdiag ships (what `memdiag demo` and `memdiag serve` gate with)."""
    from importlib import resources

    return Path(str(resources.files("memdiag").joinpath("data", "gate.toml")))


class PolicyError(ValueError):
    """The policy file is not a policy: the message says what to change."""


@dataclass(frozen=True, slots=True)
class Rule:
    metric: Metric
    max_regression: float


@dataclass(frozen=True, slots=True)
class Policy:
    min_questions: int
    min_repeats: int | None
    rules: tuple[Rule, ...]
    same_config: str = "note"
    source: str = ""
    same_fixture: str = "refuse"
    #: only questions whose judgements all say label_status = "reviewed" count
    require_reviewed: bool = False
    #: only judgements of this split count (None: every judgement)
    split: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "min_questions": self.min_questions,
            "min_repeats": self.min_repeats,
            "require_reviewed": self.require_reviewed,
            "split": self.split,
            "metrics": {r.metric.name: {"max_regression": r.max_regression} for r in self.rules},
            "same_config": self.same_config,
            "same_fixture": self.same_fixture,
        }


def _int(table: dict[str, Any], key: str, where: str) -> int | None:
    v = table.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise PolicyError(f"{where} {key} must be a whole number >= 1, not {v!r}")
    return v


def _unknown(table: dict[str, Any], known: Sequence[str], where: str) -> None:
    extra = sorted(set(table) - set(known))
    if extra:
        raise PolicyError(
            f"{where} has unknown key{'s' if len(extra) > 1 else ''} {', '.join(extra)} "
            f"(known: {', '.join(known)})"
        )


def parse_policy(text: str, source: str = "") -> Policy:
    """A policy from TOML text; :class:`PolicyError` names what is wrong and where."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"not valid TOML: {exc}") from None
    _unknown(doc, ("sample", "metrics", "provenance"), "the policy")
    sample = doc.get("sample")
    if not isinstance(sample, dict) or "min_questions" not in sample:
        raise PolicyError(
            "the policy needs [sample] min_questions = N: the fewest distinct paired "
            "questions to judge on (see --explain for how many an allowance takes)"
        )
    _unknown(sample, ("min_questions", "min_repeats", "require_reviewed", "split"), "[sample]")
    min_questions = _int(sample, "min_questions", "[sample]") or 0  # present: never 0
    require_reviewed = sample.get("require_reviewed", False)
    if not isinstance(require_reviewed, bool):
        raise PolicyError(
            f"[sample] require_reviewed must be true or false, not {require_reviewed!r}"
        )
    split = sample.get("split")
    if split is not None and (not isinstance(split, str) or not split):
        raise PolicyError(
            f'[sample] split must be a split\'s name (e.g. "held_out"), not {split!r}'
        )
    metrics = doc.get("metrics")
    if not isinstance(metrics, dict) or not metrics:
        raise PolicyError(
            "the policy states no metric: add at least one [metrics.NAME] max_regression = X "
            f"(NAME one of {', '.join(METRICS)})"
        )
    rules = []
    for name, body in metrics.items():
        if name not in METRICS:
            raise PolicyError(f"unknown metric [metrics.{name}]; known: {', '.join(METRICS)}")
        if not isinstance(body, dict):
            raise PolicyError(f"[metrics.{name}] must be a table with max_regression = X")
        _unknown(body, ("max_regression",), f"[metrics.{name}]")
        x = body.get("max_regression")
        if isinstance(x, bool) or not isinstance(x, int | float) or not 0 <= x < math.inf:
            raise PolicyError(
                f"[metrics.{name}] max_regression must be a finite number >= 0 in the metric's "
                "unit "
                f"({METRICS[name].unit}), not {x!r}"
            )
        if METRICS[name].unit == "fraction" and x > 1:
            raise PolicyError(
                f"[metrics.{name}] max_regression = {x} but {name} is a fraction 0-1 "
                f"(0.02 is 2 points)"
            )
        rules.append(Rule(METRICS[name], float(x)))
    prov = doc.get("provenance", {})
    if not isinstance(prov, dict):
        raise PolicyError("[provenance] must be a table")
    _unknown(prov, ("same_config", "same_fixture"), "[provenance]")
    same_config = prov.get("same_config", "note")
    if same_config not in SAME_CONFIG:
        raise PolicyError(
            f"[provenance] same_config must be one of {', '.join(SAME_CONFIG)}, not {same_config!r}"
        )
    same_fixture = prov.get("same_fixture", "refuse")
    if same_fixture not in SAME_FIXTURE:
        raise PolicyError(
            f"[provenance] same_fixture must be one of {', '.join(SAME_FIXTURE)}, not "
            f"{same_fixture!r}"
        )
    return Policy(
        min_questions,
        _int(sample, "min_repeats", "[sample]"),
        tuple(sorted(rules, key=lambda r: list(METRICS).index(r.metric.name))),
        same_config,
        source,
        same_fixture,
        require_reviewed,
        split,
    )


def load_policy(path: str | Path) -> Policy:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(f"cannot read the policy {str(path)!r}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise PolicyError(f"the policy {str(path)!r} is not UTF-8 text: {exc.reason} at byte "
                          f"{exc.start}") from None  # fmt: skip
    return parse_policy(text, str(path))


def explain(policy: Policy) -> str:
    """The policy in words."""
    src = f" ({policy.source})" if policy.source else ""
    repeats = (
        f", each with at least {policy.min_repeats} paired repeat"
        f"{'' if policy.min_repeats == 1 else 's'}"
        if policy.min_repeats
        else ""
    )
    lines = [
        f"This policy{src} passes a candidate unless the data show one of its metrics "
        "regressed beyond the allowance.",
        "",
        f"It judges only with at least {policy.min_questions} distinct questions paired by "
        f"(question_id, repeat_index) between the two runs{repeats}; with fewer, the gate "
        "cannot judge (exit 2)."
        + (f' Only judgements of the split "{policy.split}" count.' if policy.split else "")
        + (" Only questions whose judgements all say label_status = \"reviewed\" count."
           if policy.require_reviewed else ""),
        "Runs with a different suite_checksum are never compared (exit 2). Runs with a "
        "different fixture_checksum (other memories loaded) "
        + ("are not compared (exit 2)." if policy.same_fixture == "refuse"
           else "are compared, with a note.")
        + " When both runs carry the same config_fingerprint the gate "
        + ("says so in a note." if policy.same_config == "note"
           else "refuses to judge (exit 2): the candidate is not a different configuration."),
        "A tokens metric is judged only when every paired answer carries its token count on "
        "both sides or on neither.",
        "",
        f"Per metric, the {LEVEL:.0%} paired bootstrap interval of candidate − baseline "
        f"({RESAMPLES:,} resamples of the questions, each with all its repeats; seed {SEED}). "
        "Every question weighs the same, however many repeats it has: a side's mean is the "
        "mean over questions of each question's mean over its answers, and the delta the "
        "mean over questions of each one's mean difference over its pairs:",
    ]  # fmt: skip
    for r in policy.rules:
        m, x = r.metric, r.max_regression
        if m.higher_is_better:
            rule = f"fails when the interval's lower bound is below {fmt(m.unit, -x, True)}"
        else:
            rule = f"fails when the interval's upper bound is above {fmt(m.unit, x, True)}"
        lines.append(f"  - {m.name}: {rule}.\n      {m.name} = {m.means}.")
    lines += [
        "",
        "A candidate whose point estimate improves still fails when its interval reaches "
        "past the allowance: the gate asks for evidence. The interval's half-width is about "
        "1.96·σ/√n over n questions, σ the standard deviation of the per-question deltas; "
        "an unchanged candidate passes an allowance X only with n well above (1.96·σ/X)² "
        "(accuracy with σ = 0.4 and X = 0.03: about 680 questions). The gate's output gives "
        "each interval's half-width.",
        "Exit 0 = pass, 1 = a judged regression and nothing else, 2 = cannot judge or error.",
    ]
    return "\n".join(lines)


# -- judging ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MetricVerdict:
    rule: Rule
    verdict: str  # PASS, REGRESSION or CANNOT_JUDGE
    paired: Paired | None
    why: str

    @property
    def bound(self) -> float | None:
        """The interval bound the rule judges: the lower one when higher is better."""
        if self.paired is None:
            return None
        return self.paired.ci.low if self.rule.metric.higher_is_better else self.paired.ci.high

    def as_dict(self) -> dict[str, Any]:
        m = self.rule.metric
        return {
            "metric": m.name,
            "verdict": self.verdict,
            "max_regression": self.rule.max_regression,
            "judged_bound": "low" if m.higher_is_better else "high",
            "limit": 0.0 - self.rule.max_regression if m.higher_is_better
            else self.rule.max_regression,
            "half_width": None if self.paired is None
            else (self.paired.ci.high - self.paired.ci.low) / 2,
            "bound": self.bound,
            **(self.paired.as_dict() if self.paired else {"unit": m.unit,
                                                          "higher_is_better": m.higher_is_better}),
            "why": self.why,
        }  # fmt: skip


@dataclass
class Verdict:
    verdict: str
    reason: str
    metrics: list[MetricVerdict] = field(default_factory=list)
    sample: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    baseline: dict[str, Any] = field(default_factory=dict)
    candidate: dict[str, Any] = field(default_factory=dict)
    policy: Policy | None = None

    @property
    def status(self) -> int:
        return STATUS[self.verdict]

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "verdict": self.verdict,
            "reason": self.reason,
            "baseline": self.baseline,
            "candidate": self.candidate,
            "sample": self.sample,
            "metrics": [m.as_dict() for m in self.metrics],
            "notes": self.notes,
            "policy": None if self.policy is None else self.policy.as_dict(),
        }


def _judge_metric(rule: Rule, p: Paired | None, min_questions: int) -> MetricVerdict:
    m, x = rule.metric, rule.max_regression
    if p is None:
        return MetricVerdict(rule, CANNOT_JUDGE, None,
                             f"no paired answer carries {m.name} on both sides")  # fmt: skip
    if p.questions < min_questions:
        return MetricVerdict(rule, CANNOT_JUDGE, p,
                             f"{m.name} is measured on {p.questions} paired questions, the "
                             f"policy needs {min_questions}")  # fmt: skip
    level = f"{p.ci.level:.0%}"
    if m.higher_is_better:
        regressed, bound, limit = p.ci.low < -x, p.ci.low, 0.0 - x
    else:
        regressed, bound, limit = p.ci.high > x, p.ci.high, x
    digits = 1
    while digits < 6 and fmt(m.unit, bound, True, digits=digits) == fmt(
        m.unit, limit, True, digits=digits
    ):
        digits += 1  # never "reaches -2.0, -2.0 allowed" for a bound just past the limit
    said = (
        f"{m.name}: its {level} interval reaches {fmt(m.unit, bound, True, digits=digits)}, "
        f"{'' if regressed else 'within '}{fmt(m.unit, limit, True, digits=digits)} allowed "
        f"(point estimate {fmt(m.unit, p.delta, True)}"
    )
    within = p.delta >= limit if m.higher_is_better else p.delta <= limit
    if regressed and within:
        half = (p.ci.high - p.ci.low) / 2
        said += (
            f"; the interval is ±{fmt(m.unit, half, True, bare=True).lstrip('+')} "
            f"{'pts' if m.unit == 'fraction' else m.unit} wide on {p.questions} questions: "
            "more questions narrow it"
        )
    return MetricVerdict(rule, REGRESSION if regressed else PASS, p, said + ")")


def _one(values: list[str | None], who: str, field_name: str) -> tuple[str | None, str | None]:
    """The one value a side carries of a provenance field, or a reason it cannot be used."""
    given = sorted({v for v in values if v is not None})
    if len(given) > 1:
        return None, f"the {who} mixes {field_name}s ({', '.join(given)})"
    return (given[0] if given else None), None


def _provenance(v: Verdict, base: list[Judged], cand: list[Judged], policy: Policy) -> str | None:
    """Check the two sides' provenance: the reason the gate cannot judge, or None (notes
    go on the verdict)."""
    b_suite, b_why = _one([j.suite_checksum for j in base], "baseline", "suite_checksum")
    c_suite, c_why = _one([j.suite_checksum for j in cand], "candidate", "suite_checksum")
    b_conf, b_mix = _one([j.config_fingerprint for j in base], "baseline", "config_fingerprint")
    c_conf, c_mix = _one([j.config_fingerprint for j in cand], "candidate", "config_fingerprint")
    b_fix, b_fmix = _one([j.fixture_checksum for j in base], "baseline", "fixture_checksum")
    c_fix, c_fmix = _one([j.fixture_checksum for j in cand], "candidate", "fixture_checksum")
    v.baseline.update(suite_checksum=b_suite, config_fingerprint=b_conf, fixture_checksum=b_fix)
    v.candidate.update(suite_checksum=c_suite, config_fingerprint=c_conf, fixture_checksum=c_fix)
    if b_why or c_why:
        return f"{b_why or c_why}: compare one suite at a time"
    refuse_fixture = policy.same_fixture == "refuse"
    said = '[provenance] same_fixture = "refuse"' if refuse_fixture else ""
    for why in (b_fmix, c_fmix):
        if why and refuse_fixture:
            return f"{why}: the answers saw different memories ({said})"
        if why:
            v.notes.append(f"{why}: the answers saw different memories")
    if b_fix and c_fix and b_fix != c_fix:
        differs = (f"different fixture_checksum (baseline {b_fix}, candidate {c_fix}): the "
                   "runs loaded different memories")  # fmt: skip
        if refuse_fixture:
            return f"{differs}; rerun one on the other's fixtures ({said})"
        v.notes.append(differs)
    if b_suite and c_suite and b_suite != c_suite:
        return (
            f"different suite_checksum (baseline {b_suite}, candidate {c_suite}): the runs "
            "answered different questions; rerun the baseline on this suite"
        )
    if not b_suite and not c_suite:
        v.notes.append("neither run carries a suite_checksum: that they ran one suite is "
                       "taken on trust")  # fmt: skip
    elif not b_suite or not c_suite:
        missing = "baseline" if not b_suite else "candidate"
        v.notes.append(f"the {missing} carries no suite_checksum: the suites cannot be checked")
    for which, js in (("baseline", base), ("candidate", cand)):
        bare = sum(j.suite_checksum is None for j in js)
        if bare and bare < len(js):
            v.notes.append(f"{bare} of {len(js)} {which} judgements carry no suite_checksum")
    for why in (b_mix, c_mix):
        if why:
            v.notes.append(why)
    if b_conf and b_conf == c_conf:
        if policy.same_config == "refuse":
            return (
                f"both runs carry config_fingerprint {b_conf}: the candidate is not a different "
                'configuration ([provenance] same_config = "refuse")'
            )
        v.notes.append(f"both runs carry config_fingerprint {b_conf}: is this the same config?")
    return None


def _hygiene(
    v: Verdict, base: list[Judged], cand: list[Judged], policy: Policy
) -> tuple[list[Judged], list[Judged]]:
    """The judgements that count under the policy's ``split`` and ``require_reviewed``
    (contract section 10), and what was left out, in the verdict's sample and notes."""
    left: dict[str, int] = {}
    if policy.split is not None:
        n = len(base) + len(cand)
        base = [j for j in base if j.split == policy.split]
        cand = [j for j in cand if j.split == policy.split]
        left["other_split"] = n - len(base) - len(cand)
    if policy.require_reviewed:
        unreviewed = {j.question_id for j in (*base, *cand) if j.label_status != "reviewed"}
        n = len(base) + len(cand)
        base = [j for j in base if j.question_id not in unreviewed]
        cand = [j for j in cand if j.question_id not in unreviewed]
        left["unreviewed_questions"] = len(unreviewed)
        left["unreviewed_answers"] = n - len(base) - len(cand)
    if left:
        v.sample["left_out"] = left
        said = []
        if left.get("other_split"):
            said.append(f'{left["other_split"]} answers of a split other than "{policy.split}"')
        if left.get("unreviewed_questions"):
            said.append(f"{left['unreviewed_questions']} questions with an unreviewed label "
                        f"({left['unreviewed_answers']} answers)")  # fmt: skip
        if said:
            v.notes.append("left out by the policy: " + "; ".join(said))
    return base, cand


def _unjudgeable_tokens(rule: Rule, b: dict[Any, Judged], c: dict[Any, Judged]) -> str | None:
    """Why a token metric cannot be judged: some paired answers carry it on one side only
    (a side that stopped reporting tokens would look cheaper; contract section 10)."""
    if rule.metric.name not in TOKEN_METRICS:
        return None
    value = rule.metric.value
    keys = b.keys() & c.keys()
    only_b = sum(value(b[k]) is not None and value(c[k]) is None for k in keys)
    only_c = sum(value(b[k]) is None and value(c[k]) is not None for k in keys)
    if not only_b and not only_c:
        return None
    return (f"{rule.metric.name}: {only_b + only_c} of {len(keys)} paired answers carry it on "
            f"one side only (baseline only {only_b}, candidate only {only_c}); send token counts "
            "on both sides")  # fmt: skip


def judge(
    base: list[Judged],
    cand: list[Judged],
    policy: Policy,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> Verdict:
    """The verdict on two sides' judgements (each one condition already), by the policy."""
    v = Verdict(CANNOT_JUDGE, "", policy=policy)
    # the policy's split and labels first: provenance is checked on what counts
    base, cand = _hygiene(v, base, cand, policy)
    if v.sample.get("left_out") and (not base or not cand):
        rules = [f'split = "{policy.split}"'] if policy.split else []
        rules += ["require_reviewed"] if policy.require_reviewed else []
        v.reason = ("cannot judge: no judgement of the "
                    + ("baseline" if not base else "candidate") + " is left under the policy's "
                    "[sample] " + " and ".join(rules))  # fmt: skip
        return v
    refused = _provenance(v, base, cand, policy)
    if refused:
        v.reason = f"cannot judge: {refused}"
        return v

    b = {(j.question_id, j.repeat_index): j for j in base}
    c = {(j.question_id, j.repeat_index): j for j in cand}
    keys = b.keys() & c.keys()
    per_question: dict[str, int] = {}
    for q, _ in keys:
        per_question[q] = per_question.get(q, 0) + 1
    fewest = min(per_question.values(), default=0)
    v.sample = {
        **v.sample,
        "pairs": len(keys),
        "questions": len(per_question),
        "fewest_repeats": fewest,
        "baseline_only": len(b.keys() - c.keys()),
        "candidate_only": len(c.keys() - b.keys()),
    }
    if not keys:
        v.reason = "cannot judge: the runs share no (question_id, repeat_index)" + (
            " that the policy counts" if v.sample.get("left_out") else ""
        )
        return v
    if v.sample["baseline_only"] or v.sample["candidate_only"]:
        v.notes.append(
            f"{v.sample['baseline_only']} baseline and {v.sample['candidate_only']} candidate "
            "answers have no pair and are left out"
        )
    if len(per_question) < policy.min_questions:
        v.reason = (
            f"cannot judge: {len(per_question)} paired questions, the policy needs "
            f"{policy.min_questions}"
        )
        return v
    if policy.min_repeats and fewest < policy.min_repeats:
        short = sum(n < policy.min_repeats for n in per_question.values())
        v.reason = (
            f"cannot judge: {short} of {len(per_question)} paired questions have fewer than "
            f"{policy.min_repeats} paired repeats (fewest {fewest})"
        )
        return v
    v.metrics = [
        MetricVerdict(r, CANNOT_JUDGE, None, why)
        if (why := _unjudgeable_tokens(r, b, c))
        else _judge_metric(r, paired(r.metric, b, c, resamples, seed, LEVEL), policy.min_questions)
        for r in policy.rules
    ]
    regressed = [m for m in v.metrics if m.verdict == REGRESSION]
    unjudged = [m for m in v.metrics if m.verdict == CANNOT_JUDGE]
    sample = f"{len(per_question)} paired questions, {len(keys)} pairs"
    if unjudged:
        v.reason = "cannot judge: " + "; ".join(m.why for m in unjudged)
        if regressed:
            v.reason += "; and regressed: " + "; ".join(m.why for m in regressed)
    elif regressed:
        v.verdict = REGRESSION
        v.reason = f"regression ({sample}): " + "; ".join(m.why for m in regressed)
    else:
        v.verdict = PASS
        names = [m.rule.metric.name for m in v.metrics]
        listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        v.reason = f"pass: {listed} within the policy on {sample}"
    return v


def run_gate(
    con: duckdb.DuckDBPyConnection,
    baseline: str | Side,
    candidate: str | Side,
    policy: Policy,
    baseline_condition: str | None = None,
    candidate_condition: str | None = None,
) -> Verdict:
    """Read both sides (runs or run groups) from DuckDB and judge them. :class:`UnknownRun`
    when one is missing."""
    b_side = side(baseline, condition=baseline_condition)
    c_side = side(candidate, condition=candidate_condition)
    base, cand = load_side(con, b_side), load_side(con, c_side)
    try:
        same_sides(b_side, base, c_side, cand)
    except SameSides as exc:
        return cannot_judge(str(exc), policy)
    v = judge(base, cand, policy)
    v.baseline.update(side_dict(b_side, base))
    v.candidate.update(side_dict(c_side, cand))
    return v


@dataclass(frozen=True)
class Explained:
    """``gate --explain``: the policy in words (exit 0)."""

    words: str
    policy: Policy
    status: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"status": 0, "verdict": "explain", "reason": "the policy in words",
                "explain": self.words, "policy": self.policy.as_dict()}  # fmt: skip


def verdict_of(
    connect: Callable[[], duckdb.DuckDBPyConnection] | None,
    baseline: str | None,
    candidate: str | None,
    baseline_condition: str | None,
    candidate_condition: str | None,
    policy_path: str | None,
    explain_only: bool = False,
    db: str = "the DuckDB file",
    baseline_group: str | None = None,
    candidate_group: str | None = None,
) -> Verdict | Explained:
    """What ``memdiag gate`` answers, whatever happens: the policy in words (``explain_only``),
    or a verdict. Every failure is a verdict of status 2 (cannot judge, or error), never an
    exception: the contract's exits are 0, 1 and 2 only. The file is opened (``connect``)
    only once the arguments hold, and closed here."""
    from memdiag.analytics.db import DatabaseError
    from memdiag.analytics.scores import NeedsCondition

    policy = None
    try:
        if policy_path is None:
            raise PolicyError("--policy FILE is required")
        policy = load_policy(policy_path)
        if explain_only:
            return Explained(explain(policy), policy)
        named = (("baseline", baseline, baseline_group), ("candidate", candidate, candidate_group))
        missing = [f"--{n} (or --{n}-group G)" for n, run, group in named if run is group is None]
        if missing:
            raise SideError(f"{' and '.join(missing)} required (or --explain)")
        b_side = _side_of("baseline", baseline, baseline_group, baseline_condition)
        c_side = _side_of("candidate", candidate, candidate_group, candidate_condition)
        if connect is None:
            raise DatabaseError("no DuckDB file given")
        con = connect()
        try:
            verdict = run_gate(con, b_side, c_side, policy)
            verdict.notes += doctor_notes(con, b_side, c_side, policy)
            return verdict
        finally:
            con.close()
    except (PolicyError, NeedsCondition) as exc:
        return error(f"{exc}", policy)
    except UnknownRun as exc:
        return cannot_judge(str(exc), policy)
    except ModuleNotFoundError as exc:
        return error(f"memdiag gate needs {exc.name}, which the worker's install leaves out: "
                     "pip install 'memdiag[report]'", policy)  # fmt: skip
    except (DatabaseError, duckdb.Error, OSError) as exc:
        hint = (
            " (a file written by an older memdiag: let `memdiag sink --db` open it once to "
            "upgrade it)"
            if isinstance(exc, duckdb.BinderException | duckdb.CatalogException)
            else ""
        )
        return error(f"cannot read {db}: {str(exc).splitlines()[0]}{hint}", policy)
    except Exception as exc:  # noqa: BLE001 - exit 1 means a regression: nothing else may
        return error(f"{type(exc).__name__}: {exc}", policy)


class SideError(PolicyError):
    """The two sides are not named right: a usage error, with what to give."""


def _side_of(which: str, run: str | None, group: str | None, condition: str | None) -> Side:
    """One side from ``--baseline RUN`` or ``--baseline-group G`` (exactly one of them)."""
    if run is not None and group is not None:
        raise SideError(f"give --{which} RUN or --{which}-group G, not both")
    if run is None and group is None:
        raise SideError(f"--{which} RUN or --{which}-group G is required (or --explain)")
    return Side(run, group, condition)


def doctor_notes(
    con: duckdb.DuckDBPyConnection, baseline: Side, candidate: Side, policy: Policy
) -> list[str]:
    """What ``memdiag doctor`` finds weak or refuses in the two sides, as the gate's notes:
    a verdict read beside what weakens it."""
    from memdiag.analytics.doctor import NOTE, doctor

    found = doctor(con, baseline, candidate, policy.min_questions)
    # what the policy itself settles the gate says in its own notes
    settled = {"fixture_differs", "mixed_fixture"} if policy.same_fixture == "note" else set()
    return [f"doctor: {f.subject}: {f.message}" for f in found
            if f.level != NOTE and f.check != "no_data" and f.check not in settled]  # fmt: skip


HEADLINE = {PASS: "pass", REGRESSION: "regression", CANNOT_JUDGE: "cannot judge",
            ERROR: "error"}  # fmt: skip


def _side_name(s: dict[str, Any]) -> str:
    run, group = s.get("run_id"), s.get("run_group_id")
    if run is None and group is None:
        return "?"
    who = f"`{run}`" if run is not None else f"group `{group}` ({len(s.get('runs', []))} runs)"
    return who + (f" ({s['condition']})" if s.get("condition") else "")


def markdown(v: Verdict) -> str:
    """A summary a CI job can post as-is (a pull-request comment, a job summary)."""
    lines = [f"## memdiag gate: {HEADLINE[v.verdict]} (exit {v.status})", ""]
    if v.baseline.get("run_id") or v.baseline.get("run_group_id"):
        lines.append(f"**baseline** {_side_name(v.baseline)} · **candidate** "
                     f"{_side_name(v.candidate)}"
                     + (f" · {v.sample['questions']} paired questions, {v.sample['pairs']} "
                        "pairs" if v.sample else ""))  # fmt: skip
        lines.append("")
    if v.metrics:
        lines += [
            "| metric | baseline | candidate | delta | 95% interval | allowed | verdict |",
            "|---|---:|---:|---:|---|---:|---|",
        ]
        for mv in v.metrics:
            m, p = mv.rule.metric, mv.paired
            x = mv.rule.max_regression
            allowed = fmt(m.unit, -x if m.higher_is_better else x, True)
            side = "lower bound ≥" if m.higher_is_better else "upper bound ≤"
            if p is None:
                cells = ["—", "—", "—", "—"]
            else:
                ci = f"{fmt(m.unit, p.ci.low, True)} to {fmt(m.unit, p.ci.high, True)}"
                cells = [fmt(m.unit, p.baseline_mean), fmt(m.unit, p.candidate_mean),
                         fmt(m.unit, p.delta, True), ci]  # fmt: skip
            verdict = {PASS: "pass", REGRESSION: "**regression**",
                       CANNOT_JUDGE: "cannot judge"}[mv.verdict]  # fmt: skip
            row = [m.name, *cells, f"{side} {allowed}", verdict]
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    lines.append(f"> {v.reason}")
    if v.notes:
        lines += ["", *(f"- note: {n}" for n in v.notes)]
    prov = [
        f"{k} {v.baseline.get(k) or '—'} → {v.candidate.get(k) or '—'}"
        for k in ("suite_checksum", "fixture_checksum", "config_fingerprint")
        if v.baseline.get(k) or v.candidate.get(k)
    ]
    if prov:
        lines += ["", "Provenance: " + " · ".join(prov)]
    if v.policy is not None:
        lines += [
            "",
            f"Policy{f' `{v.policy.source}`' if v.policy.source else ''}: at least "
            f"{v.policy.min_questions} paired questions"
            + (f", {v.policy.min_repeats} repeats each" if v.policy.min_repeats else "")
            + f"; judged on the {LEVEL:.0%} paired bootstrap interval over questions "
            f"({RESAMPLES:,} resamples, seed {SEED}), not the point estimate.",
        ]
    return "\n".join(lines) + "\n"


def error(reason: str, policy: Policy | None = None) -> Verdict:
    return Verdict(ERROR, f"error: {reason}", policy=policy)


def cannot_judge(reason: str, policy: Policy | None = None) -> Verdict:
    return Verdict(CANNOT_JUDGE, f"cannot judge: {reason}", policy=policy)


__all__ = [
    "CANNOT_JUDGE",
    "ERROR",
    "PASS",
    "REGRESSION",
    "MetricVerdict",
    "Policy",
    "PolicyError",
    "Rule",
    "UnknownRun",
    "Verdict",
    "cannot_judge",
    "error",
    "explain",
    "judge",
    "markdown",
    "load_policy",
    "parse_policy",
    "run_gate",
    "verdict_of",
]
