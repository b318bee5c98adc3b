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

from memdiag.analytics.metrics import METRICS, Metric, Paired, fmt, paired
from memdiag.analytics.scores import Judged, UnknownRun, load, pick_condition

PASS, REGRESSION, CANNOT_JUDGE, ERROR = "pass", "regression", "cannot_judge", "error"
STATUS = {PASS: 0, REGRESSION: 1, CANNOT_JUDGE: 2, ERROR: 2}
#: what the policy may say when both runs carry one config_fingerprint
SAME_CONFIG = ("note", "refuse")
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

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "min_questions": self.min_questions,
            "min_repeats": self.min_repeats,
            "metrics": {r.metric.name: {"max_regression": r.max_regression} for r in self.rules},
            "same_config": self.same_config,
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
    _unknown(sample, ("min_questions", "min_repeats"), "[sample]")
    min_questions = _int(sample, "min_questions", "[sample]") or 0  # present: never 0
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
    _unknown(prov, ("same_config",), "[provenance]")
    same_config = prov.get("same_config", "note")
    if same_config not in SAME_CONFIG:
        raise PolicyError(
            f"[provenance] same_config must be one of {', '.join(SAME_CONFIG)}, not {same_config!r}"
        )
    return Policy(
        min_questions,
        _int(sample, "min_repeats", "[sample]"),
        tuple(sorted(rules, key=lambda r: list(METRICS).index(r.metric.name))),
        same_config,
        source,
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
        f", each with at least {policy.min_repeats} paired repeats" if policy.min_repeats else ""
    )
    lines = [
        f"This policy{src} passes a candidate unless the data show one of its metrics "
        "regressed beyond the allowance.",
        "",
        f"It judges only with at least {policy.min_questions} distinct questions paired by "
        f"(question_id, repeat_index) between the two runs{repeats}; with fewer, the gate "
        "cannot judge (exit 2).",
        "Runs with a different suite_checksum are never compared (exit 2). When both runs "
        "carry the same config_fingerprint the gate "
        + ("says so in a note." if policy.same_config == "note"
           else "refuses to judge (exit 2): the candidate is not a different configuration."),
        "",
        f"Per metric, the {LEVEL:.0%} paired bootstrap interval of candidate − baseline "
        f"({RESAMPLES:,} resamples of the questions, each with all its repeats; seed {SEED}):",
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


def _one(values: list[str | None], side: str, field_name: str) -> tuple[str | None, str | None]:
    """The one value a side carries of a provenance field, or a reason it cannot be used."""
    given = sorted({v for v in values if v is not None})
    if len(given) > 1:
        return None, f"the {side} mixes {field_name}s ({', '.join(given)})"
    return (given[0] if given else None), None


def _provenance(v: Verdict, base: list[Judged], cand: list[Judged], policy: Policy) -> str | None:
    """Check the two sides' provenance: the reason the gate cannot judge, or None (notes
    go on the verdict)."""
    b_suite, b_why = _one([j.suite_checksum for j in base], "baseline", "suite_checksum")
    c_suite, c_why = _one([j.suite_checksum for j in cand], "candidate", "suite_checksum")
    b_conf, b_mix = _one([j.config_fingerprint for j in base], "baseline", "config_fingerprint")
    c_conf, c_mix = _one([j.config_fingerprint for j in cand], "candidate", "config_fingerprint")
    v.baseline.update(suite_checksum=b_suite, config_fingerprint=b_conf)
    v.candidate.update(suite_checksum=c_suite, config_fingerprint=c_conf)
    if b_why or c_why:
        return f"{b_why or c_why}: compare one suite at a time"
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
    for side, js in (("baseline", base), ("candidate", cand)):
        bare = sum(j.suite_checksum is None for j in js)
        if bare and bare < len(js):
            v.notes.append(f"{bare} of {len(js)} {side} judgements carry no suite_checksum")
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


def judge(
    base: list[Judged],
    cand: list[Judged],
    policy: Policy,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> Verdict:
    """The verdict on two sides' judgements (each one condition already), by the policy."""
    v = Verdict(CANNOT_JUDGE, "", policy=policy)
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
        "pairs": len(keys),
        "questions": len(per_question),
        "fewest_repeats": fewest,
        "baseline_only": len(b.keys() - c.keys()),
        "candidate_only": len(c.keys() - b.keys()),
    }
    if not keys:
        v.reason = "cannot judge: the runs share no (question_id, repeat_index)"
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
        _judge_metric(r, paired(r.metric, b, c, resamples, seed, LEVEL), policy.min_questions)
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
    baseline: str,
    candidate: str,
    policy: Policy,
    baseline_condition: str | None = None,
    candidate_condition: str | None = None,
) -> Verdict:
    """Read both runs from DuckDB and judge them. :class:`UnknownRun` when one is missing."""
    base = pick_condition(load(con, baseline), baseline, baseline_condition)
    cand = pick_condition(load(con, candidate), candidate, candidate_condition)
    if baseline == candidate and base[0].condition == cand[0].condition:
        return cannot_judge(
            f"the baseline and the candidate are one run ({baseline!r}) and one condition: "
            "name two runs, or two conditions of the run",
            policy,
        )
    v = judge(base, cand, policy)
    v.baseline.update(run_id=baseline, condition=base[0].condition)
    v.candidate.update(run_id=candidate, condition=cand[0].condition)
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
        missing = [f"--{n}" for n, v in (("baseline", baseline), ("candidate", candidate))
                   if v is None]  # fmt: skip
        if missing:
            raise PolicyError(f"{' and '.join(missing)} required (or --explain)")
        if connect is None:
            raise DatabaseError("no DuckDB file given")
        con = connect()
        try:
            verdict = run_gate(con, baseline or "", candidate or "", policy, baseline_condition,
                               candidate_condition)  # fmt: skip
            verdict.notes += doctor_notes(con, baseline or "", candidate or "", policy,
                                          baseline_condition, candidate_condition)  # fmt: skip
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


def doctor_notes(
    con: duckdb.DuckDBPyConnection,
    baseline: str,
    candidate: str,
    policy: Policy,
    baseline_condition: str | None,
    candidate_condition: str | None,
) -> list[str]:
    """What ``memdiag doctor`` finds weak or refuses in the two runs, as the gate's notes:
    a verdict read beside what weakens it."""
    from memdiag.analytics.doctor import NOTE, doctor

    found = doctor(con, (baseline, baseline_condition), (candidate, candidate_condition),
                   policy.min_questions)  # fmt: skip
    return [f"doctor: {f.subject}: {f.message}" for f in found
            if f.level != NOTE and f.check != "no_data"]  # fmt: skip


HEADLINE = {PASS: "pass", REGRESSION: "regression", CANNOT_JUDGE: "cannot judge",
            ERROR: "error"}  # fmt: skip


def _side_name(side: dict[str, Any]) -> str:
    run = side.get("run_id")
    if run is None:
        return "?"
    return f"`{run}`" + (f" ({side['condition']})" if side.get("condition") else "")


def markdown(v: Verdict) -> str:
    """A summary a CI job can post as-is (a pull-request comment, a job summary)."""
    lines = [f"## memdiag gate: {HEADLINE[v.verdict]} (exit {v.status})", ""]
    if v.baseline.get("run_id"):
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
        for k in ("suite_checksum", "config_fingerprint")
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
