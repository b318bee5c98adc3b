"""Every question an analyst asks memdiag, declared once: its arguments, and the one function
that fetches its answer from a DuckDB connection.

The answers are plain data (dicts and lists, JSON as they are). Four renderers read them: the
terminal's (:mod:`memdiag.cli.render`), ``--json``, the static report and the live pages
(:mod:`memdiag.views.html`). The command line builds its parsers from these declarations and
one runner answers them (:mod:`memdiag.cli.answer`); the pages take the same arguments from
their URL. A new question is one declaration here and its renderers.

An argument that names an id (``known``) is checked before the fetch: an unknown one is
:class:`~memdiag.analytics.lookup.NotFound`, with the closest known ids, never an empty
answer.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import duckdb

    from memdiag.analytics import queries
else:

    class _OnFirstUse:
        """A module imported when one of its names is first read. The command line builds
        its parsers from this module for every command, ``memdiag worker`` too, and DuckDB
        alone is 25 MB of a process's resident memory: the worker never opens it."""

        def __init__(self, name: str):
            self._name = name
            self._module: ModuleType | None = None

        def __getattr__(self, attr: str) -> Any:
            if self._module is None:
                self._module = importlib.import_module(self._name)
            return getattr(self._module, attr)

    queries = _OnFirstUse("memdiag.analytics.queries")


def ensure_known(con: duckdb.DuckDBPyConnection, kind: str, value: str | None) -> None:
    from memdiag.analytics.lookup import ensure_known as check

    check(con, kind, value)


# -- how arguments are read (from a command line or a URL): text -> value, ValueError says why


def since(text: str) -> Any:
    """``--since``: a date or date-time (UTC without an offset) or a duration back from now."""
    return queries.parse_since(text)


def duration(flag: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        return queries.parse_duration(text, flag)

    return parse


def whole(low: int, flag: str) -> Callable[[str], int]:
    """A whole number at least ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(str(text).strip())
        except ValueError:
            value = low - 1
        if value < low:
            raise ValueError(f"{flag} {text!r}: give a whole number >= {low}")
        return value

    return parse


def points(flag: str) -> Callable[[str], float]:
    """Percentage points, 0 to 100."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not 0 <= value <= 100:
            raise ValueError(f"{flag} {text!r}: give percentage points between 0 and 100")
        return value

    return parse


def windows(text: str) -> tuple[float, ...]:
    """Followup windows in seconds, comma-separated."""
    try:
        found = tuple(float(w) for w in text.split(",") if w.strip())
    except ValueError:
        found = ()
    if not found or any(not w >= 0 for w in found):
        raise ValueError(
            f"--windows {text!r}: give window lengths in seconds >= 0, comma-separated "
            "(10,30,60,120)"
        )
    return found


@dataclass(frozen=True)
class Arg:
    """One argument of a question: a command-line option (or positional) and a URL parameter."""

    name: str  # the keyword the fetch takes; the URL's query parameter
    help: str
    flag: str | None = None  # "--org"; None: positional (on a page, part of its path)
    parse: Callable[[str], Any] | None = None  # text -> value (ValueError: why not)
    default: Any = None
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    switch: bool = False  # an option without a value
    required: bool = False
    known: str | None = None  # a kind of id (analytics.lookup.KINDS): checked before the fetch
    fetch: bool = True  # False: the command's own (e.g. --html), not the fetch's

    def read(self, text: str | None) -> Any:
        """The value of ``text`` (a URL's, say); the default when it is absent or empty."""
        if text is None or text == "":
            return self.default
        if self.switch:
            return text.lower() in ("1", "true", "yes", "on")
        if self.choices and text not in self.choices:
            raise ValueError(f"{self.flag or self.name} {text!r}: one of {', '.join(self.choices)}")
        return self.parse(text) if self.parse else text


def _type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` as argparse wants a type: its ValueError is a usage error with its words."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


@dataclass(frozen=True)
class Question:
    """A question: the command that asks it, its arguments, and how its answer is fetched."""

    command: tuple[str, ...]  # ("query", "misleading"), ("status",)
    help: str  # one line, in the list of commands
    description: str  # the command's --help
    args: tuple[Arg, ...]
    fetch: Callable[..., Any]  # fetch(con, **args) -> the answer (plain data)
    #: an answer with nothing in it: under --since, the data's time span is said beside it
    empty: Callable[[Any], bool] | None = None
    #: the exit status of an answer (0 unless the question gives its status a verdict)
    status: Callable[[Any], int] | None = None
    #: whether the answer needs the DuckDB file (given the arguments)
    needs_db: Callable[[Mapping[str, Any]], bool] | None = None
    #: what the fetch takes from where it runs, not from its arguments: ``db`` (the file's
    #: path), ``stream_window`` (the worker's followup window), ``connect`` (opens the file)
    extras: tuple[str, ...] = ()
    #: it needs the report extra (numpy): checked before anything is opened
    needs_report: bool = False
    #: an error as this question's own answer (the gate's: a verdict of status 2, so that
    #: every exit prints one JSON object of one shape); None: errors are errors
    on_error: Callable[[str], Any] | None = None
    #: the exit status of every error, when the question's own statuses give 1 a meaning
    #: (doctor: 1 is "weak", so its errors are 2)
    error_exit: int | None = None

    @property
    def name(self) -> str:
        return self.command[-1]

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """This question's arguments on its command's parser."""
        for a in self.args:
            if a.flag is None:
                parser.add_argument(
                    a.name,
                    metavar=a.metavar or a.name.upper(),
                    help=a.help,
                    type=_type(a.parse) if a.parse else str,
                )
                continue
            options: dict[str, Any] = {"dest": a.name, "help": a.help}
            if a.switch:
                options["action"] = "store_true"
            else:
                options.update(default=a.default, required=a.required)
                if a.metavar:
                    options["metavar"] = a.metavar
                if a.choices:
                    options["choices"] = a.choices
                if a.parse:
                    options["type"] = _type(a.parse)
            parser.add_argument(a.flag, **options)

    def values(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The fetch's keywords from parsed values (a namespace's ``vars``)."""
        return {a.name: given.get(a.name, a.default) for a in self.args if a.fetch}

    def read(
        self,
        texts: Mapping[str, str | None],
        names: tuple[str, ...] | None = None,
        required: bool = True,
    ) -> dict[str, Any]:
        """The fetch's keywords (``names`` of them, or all) from text, a URL's path and query,
        read as the command line reads them; ValueError says which is wrong. A missing required
        one is an error too, unless ``required`` is False (a page that asks without it)."""
        values = {}
        for a in self.args:
            if not a.fetch or (names is not None and a.name not in names):
                continue
            text = texts.get(a.name)
            missing = text is None or text == ""
            if required and (a.required or a.flag is None) and missing:
                raise ValueError(f"{a.flag or a.name} is required")
            values[a.name] = a.read(text)
        return values

    def answer(
        self, con: duckdb.DuckDBPyConnection | None, context: Mapping[str, Any], **values: Any
    ) -> Any:
        """Check the ids the arguments name, then fetch; ``context`` gives the :attr:`extras`
        (``db``: the file's path; ``stream_window``: the worker's followup window)."""
        if con is not None:
            for a in self.args:
                if a.known and a.fetch:
                    ensure_known(con, a.known, values.get(a.name))
        extra = {name: context[name] for name in self.extras}
        return self.fetch(con, **values, **extra)


# -- the arguments several questions share ------------------------------------------------

ORG = Arg("org", "only this org_id", flag="--org", known="org")
PROJECT = Arg("project", "only this project_id", flag="--project", known="project")
SINCE = Arg(
    "since",
    "only at or after this time: a date, a date-time (UTC if no offset) or a "
    "duration back from now (30m, 24h, 7d)",
    flag="--since",
    parse=since,
)
AGENT = Arg("agent", "only this agent_id", flag="--agent", metavar="AGENT_ID", known="memory_agent")


def limit(default: int, what: str = "rows") -> Arg:
    return Arg(
        "limit",
        f"most {what} (default {default})",
        flag="--limit",
        parse=whole(1, "--limit"),
        default=default,
    )


def _resamples(default: int) -> Arg:
    return Arg(
        "resamples",
        f"bootstrap resamples (default {default}; 0: no intervals)",
        flag="--resamples",
        parse=whole(0, "--resamples"),
        default=default,
    )


SEED = Arg("seed", "bootstrap seed (default 0)", flag="--seed", parse=int, default=0)


def _two_runs() -> tuple[Arg, ...]:
    """The two sides of a comparison (doctor, compare, gate): each a run or a run group (every
    run of a ``run_group_id``, each one repeat), and optionally one condition of it."""
    return (
        Arg("baseline", "the run to beat", flag="--baseline", metavar="RUN_A"),
        Arg("candidate", "the run to judge", flag="--candidate", metavar="RUN_B"),
        Arg(
            "baseline_group",
            "instead of --baseline: every run of this run_group_id, each run one repeat",
            flag="--baseline-group",
            metavar="G",
        ),
        Arg(
            "candidate_group",
            "instead of --candidate: every run of this run_group_id, each run one repeat",
            flag="--candidate-group",
            metavar="G",
        ),
        Arg(
            "baseline_condition",
            "only this condition of the baseline",
            flag="--baseline-condition",
            metavar="C",
        ),
        Arg(
            "candidate_condition",
            "only this condition of the candidate",
            flag="--candidate-condition",
            metavar="C",
        ),
    )


def _side(
    which: str, run: str | None, group: str | None, condition: str | None, required: bool = True
) -> Any:
    """One side of a comparison from its options: ``--which RUN`` or ``--which-group G``."""
    from memdiag.analytics.scores import Side

    if run is not None and group is not None:
        raise Usage(f"give --{which} RUN or --{which}-group G, not both")
    if run is None and group is None:
        if required:
            raise Usage(f"--{which} RUN or --{which}-group G is required")
        return None
    return Side(run, group, condition)


# -- the fetches --------------------------------------------------------------------------


def _status(
    con: duckdb.DuckDBPyConnection,
    top: int,
    runs: int,
    recall_window: float,
    recall_drop: float,
    recall_min_probed: int,
    org: str | None = None,
    project: str | None = None,
    since: Any = None,
    stream_window: float = 30.0,
) -> dict[str, Any]:
    from memdiag.analytics.status import RecallWatch, status

    watch = RecallWatch(recall_window, recall_drop, recall_min_probed)
    return status(
        con,
        top=top,
        runs=runs,
        recall=watch,
        org=org,
        project=project,
        since=since,
        stream_window=stream_window,
    )


def _misleading(
    con: duckdb.DuckDBPyConnection, org: str | None, since: Any, limit: int, graph: bool
) -> Any:
    if graph:
        return queries.misleading_graph(con, org, since, limit)
    return queries.misleading(con, org, since, limit)


def _explain(con: duckdb.DuckDBPyConnection, session_id: str) -> dict[str, Any]:
    from memdiag.analytics.explain import explain

    return explain(con, session_id)


def _explain_memory(
    con: duckdb.DuckDBPyConnection, memory_id: str, agent: str, limit: int
) -> dict[str, Any]:
    from memdiag.analytics.memory import explain_memory

    return explain_memory(con, agent, memory_id, limit=limit)


def _breaks(con: duckdb.DuckDBPyConnection, resamples: int, seed: int) -> dict[str, Any]:
    from memdiag.analytics.breaks import break_impact

    return break_impact(con, resamples=resamples, seed=seed)


class NoSessions(LookupError):
    """Nothing to calibrate: the message says why."""


def _calibrate(
    con: duckdb.DuckDBPyConnection,
    windows: tuple[float, ...],
    org: str | None,
    project: str | None,
    since: Any,
    resamples: int,
    seed: int,
    by: str,
    events: str | None,
    labels: str | None,
    stream_window: float,
    similarity_threshold: float,
) -> dict[str, Any]:
    from memdiag.analytics.calibrate import calibrate, load, semantic_verdicts, stream_check
    from memdiag.analytics.readings import substring_flips

    if labels is not None:
        if events is not None:
            raise Usage("--labels scores labelled pairs, without the database: give --events "
                        "on its own run")  # fmt: skip
        return _labels(labels)
    sessions = load(con, org, project, since)
    check = stream_check(con, stream_window, org, project, since)
    if not len(sessions):
        filtered = " with these filters" if org or project or since else ""
        why = (
            f"; {sessions.unknown:,} were judged before memdiag stored disjoint_new_query: "
            "re-run their events through memdiag to calibrate them"
            if sessions.unknown
            else ""
        )
        raise NoSessions(f"no session with an outcome to calibrate{filtered}{why}")
    result = calibrate(sessions, windows, stream_window, resamples, seed, by=by)
    result["stream_check"] = {"window_seconds": stream_window, **check}
    result["semantic"] = semantic_verdicts(con, org, project, since)
    if result["semantic"] is None and (org or project or since):
        everything = semantic_verdicts(con)
        if everything is not None:  # say that the filters left none out of those there are
            result["semantic"] = {"verdicts": 0, "in_file": everything["verdicts"]}
    if events is not None:
        try:
            result["substring_reading"] = substring_flips(events)
            result["semantic_reading"] = _semantic_reading(events, similarity_threshold)
        except FileNotFoundError as exc:
            raise Usage(str(exc)) from None
    return result


def _semantic_reading(events: str, threshold: float) -> dict[str, Any]:
    """``calibrate --events``: the file's turns under the semantic rule at ``threshold``;
    what to install instead when the model is not (the rest of the answer stands)."""
    from memdiag import semantic
    from memdiag.analytics.readings import semantic_reading

    if not semantic.installed():
        return {"unavailable": "reading the file with the semantic rule needs its model: "
                "pip install 'memdiag[semantic]'"}  # fmt: skip
    try:
        embed = semantic.embedder()
    except semantic.ModelMissing as exc:
        return {"unavailable": str(exc)}
    last: list[Any] = [None, b""]  # the response of the turn being read, and its rows

    def similar(memory: str, response: str) -> float:
        if last[0] != response:
            last[:] = [response, embed(response, False)]
        return semantic.similarity(embed(memory, True), last[1])

    return {**semantic_reading(events, threshold, similar), "model": semantic.describe()}


def _labels(path: str) -> dict[str, Any]:
    """``calibrate --labels``: both used/ignored rules on labelled pairs (no database)."""
    from memdiag import semantic
    from memdiag.analytics.labels import LabelsError, evaluate, load

    vectors: dict[str, bytes] = {}

    def vec(text: str) -> bytes:
        v = vectors.get(text)
        if v is None:
            v = vectors[text] = semantic.model().vectors(text)
        return v

    try:
        result = evaluate(load(Path(path)), lambda m, r: semantic.similarity(vec(m), vec(r)))
    except (LabelsError, semantic.ModelMissing) as exc:
        raise Usage(str(exc)) from None
    return {"labels": result, "file": path, "model": semantic.describe()}


def _doctor(
    con: duckdb.DuckDBPyConnection,
    run: str | None,
    baseline: str | None,
    candidate: str | None,
    baseline_group: str | None,
    candidate_group: str | None,
    baseline_condition: str | None,
    candidate_condition: str | None,
    min_questions: int,
) -> dict[str, Any]:
    from memdiag.analytics.doctor import NOTE, doctor
    from memdiag.analytics.scores import Side

    if run is not None and (baseline is not None or baseline_group is not None):
        raise Usage("give --run RUN, or --baseline RUN_A (or --baseline-group G), not both")
    base = (
        Side(run, None, baseline_condition)
        if run is not None
        else _side("baseline", baseline, baseline_group, baseline_condition, required=False)
    )
    other = _side("candidate", candidate, candidate_group, candidate_condition, required=False)
    if base is None:
        raise Usage("give --run RUN, or --baseline RUN_A (or --baseline-group G) "
                    "[--candidate RUN_B | --candidate-group G]")  # fmt: skip
    if other is not None and run is not None:
        raise Usage("--candidate needs --baseline (--run checks one run)")
    findings = doctor(con, base, other, min_questions)
    no_data = any(f.check == "no_data" for f in findings)
    status = 2 if no_data else (1 if any(f.level != NOTE for f in findings) else 0)
    return {"status": status, "findings": [f.as_dict() for f in findings]}


def _compare(
    con: duckdb.DuckDBPyConnection,
    baseline: str | None,
    candidate: str | None,
    baseline_group: str | None,
    candidate_group: str | None,
    baseline_condition: str | None,
    candidate_condition: str | None,
    resamples: int,
    seed: int,
) -> dict[str, Any]:
    from memdiag.analytics import scores

    return scores.compare(
        con,
        _side("baseline", baseline, baseline_group, baseline_condition),
        _side("candidate", candidate, candidate_group, candidate_condition),
        resamples=resamples,
        seed=seed,
    )


def _scores(
    con: duckdb.DuckDBPyConnection, run_id: str, baseline_condition: str | None, db: str = ""
) -> dict[str, Any]:
    from memdiag.analytics import scores

    return scores.scores(con, run_id, db, baseline_condition)


def _gate(
    con: None,
    baseline: str | None,
    candidate: str | None,
    baseline_group: str | None,
    candidate_group: str | None,
    baseline_condition: str | None,
    candidate_condition: str | None,
    policy: Any,
    explain: bool,
    db: str,
    connect: Callable[[], Any],
) -> Any:
    """The gate's verdict, whatever happens: every failure is a verdict with status 2 (the
    contract's exits), never an exception; so it opens the file itself, inside that rule."""
    from memdiag.analytics import gate as g

    return g.verdict_of(
        connect, baseline, candidate, baseline_condition, candidate_condition, policy, explain,
        db, baseline_group, candidate_group,
    )  # fmt: skip


def _gate_error(reason: str) -> Any:
    from memdiag.analytics import gate as g

    return g.error(reason)


class Usage(ValueError):
    """Arguments that do not go together: a usage error (exit 2), the message says why."""


def _policy(path: str) -> Any:
    """``--policy FILE``: read when the gate runs (a bad one is a verdict, not a usage error)."""
    return path


# -- the questions ------------------------------------------------------------------------

_SINCE_DOC = (
    "--since takes a date or date-time (2026-11-21, 2026-11-21T09:30:00Z, UTC if no offset) or "
    "a duration back from now (30m, 24h, 7d, 2w)."
)

STATUS = Question(
    ("status",),
    "one screen: followups, used/ignored, failures, misleading memories, runs, dead letters",
    "How memory is doing, read from DuckDB: the followup rate (with its caveat), the share\n"
    "of injected memories used, failed sessions by category, the misleading memories,\n"
    "reader vs retrieval failures of the recent benchmark runs, dead letters by reason,\n"
    "and how fresh the data is (the newest event time in DuckDB). --org, --project and\n"
    "--since select the sessions, searches and verdicts (misleading memories take the org\n"
    "and the time; the pipeline, runs and dead letters are the whole file's).",
    (
        Arg(
            "top",
            "misleading memories and dead weight shown (default 5)",
            flag="--top",
            parse=whole(0, "--top"),
            default=5,
        ),
        Arg(
            "runs",
            "benchmark runs shown (default 5)",
            flag="--runs",
            parse=whole(0, "--runs"),
            default=5,
        ),
        Arg(
            "recall_window",
            "flag an agent whose semantic recall rate (SRR) in this window up "
            "to its newest memory event fell from the window before (default 24h; 30m, 6h, 7d)",
            flag="--recall-window",
            parse=duration("--recall-window"),
            default=86_400.0,
            metavar="DURATION",
        ),
        Arg(
            "recall_drop",
            "by more than this many percentage points, absolute (default 20), "
            "and by at least 2 standard errors",
            flag="--recall-drop",
            parse=points("--recall-drop"),
            default=20.0,
            metavar="POINTS",
        ),
        Arg(
            "recall_min_probed",
            "only when each window has at least N probed memories (default 10)",
            flag="--recall-min-probed",
            parse=whole(1, "--recall-min-probed"),
            default=10,
            metavar="N",
        ),
        ORG,
        PROJECT,
        SINCE,
    ),
    _status,
    empty=lambda st: not st["sessions"] and not st["followup"]["searches"],
    extras=("stream_window",),
)

FAILURE_DISTRIBUTION = Question(
    ("query", "failure-distribution"),
    "failed sessions per failure category, all seven listed (zeros included)",
    "Failed sessions per failure category, all seven listed (zeros included). " + _SINCE_DOC,
    (ORG, PROJECT, SINCE),
    lambda con, org, project, since: queries.failure_distribution(con, org, project, since),
    empty=lambda rows: not any(r["sessions"] for r in rows),
)

MISLEADING = Question(
    ("query", "misleading"),
    "observations seen in >= 3 failed sessions and in no accepted one, most failures first",
    "Observations seen in >= 3 failed sessions and in no accepted one, most failures first,\n"
    "with their weight now and the failed session each was last in. Co-occurrence with\n"
    "failure, not cause. " + _SINCE_DOC,
    (
        Arg("org", "only sessions of this org_id", flag="--org", known="org"),
        Arg(
            "since",
            "only sessions whose outcome is at or after this time",
            flag="--since",
            parse=since,
        ),
        limit(100),
        Arg(
            "graph",
            "the knowledge graph's misleading entities and edges "
            "(SOURCE|TARGET|RELATIONSHIP) instead of observations",
            flag="--graph",
            switch=True,
        ),
    ),
    _misleading,
    empty=lambda rows: not rows,
)

UNUSED_MEMORIES = Question(
    ("query", "unused-memories"),
    "dead weight: memories judged in at least N turns and used in none, with their strength "
    "and last injection (what a consolidation job would prune or demote)",
    "Dead weight: memories judged in at least N (session, turn) pairs and used in none, with\n"
    "their strength and when they were last judged (what a consolidation job would prune or\n"
    "demote). " + _SINCE_DOC,
    (
        Arg(
            "min_injections",
            "judged (session, turn) pairs at least (default 5)",
            flag="--min-injections",
            parse=whole(1, "--min-injections"),
            default=5,
            metavar="N",
        ),
        Arg("since", "only turns at or after this time", flag="--since", parse=since),
        limit(100),
    ),
    lambda con, min_injections, since, limit: queries.unused_memories(
        con, min_injections, since, limit
    ),
    empty=lambda rows: not rows,
)

OBSERVATION_STATS = Question(
    ("query", "observation-stats"),
    "how often one observation was used and ignored, its weight and its strength",
    "How often one observation (memory) was used and ignored, its weight (with its failed\n"
    "and accepted sessions), its strength, and whether it is misleading or dead weight.",
    (Arg("observation_id", "the observation", metavar="OBS_ID"),),
    lambda con, observation_id: queries.observation_stats(con, observation_id),
)

OBSERVATION_HISTORY = Question(
    ("query", "observation-history"),
    "one observation's verdicts, most recent first",
    "One observation's verdicts (used or ignored, per session and turn), the most recent\n"
    "first, each with its session's outcome and failure category.",
    (Arg("observation_id", "the observation", metavar="OBS_ID"), limit(100)),
    lambda con, observation_id, limit: queries.observation_history(con, observation_id, limit),
)

PIPELINE_HEALTH = Question(
    ("query", "pipeline-health"),
    "per agent: memories written, indexed, pending, unindexed; pipeline coverage, semantic "
    "recall rate, ambient trigger rate; broken agents first",
    "Per agent: memories written, indexed, pending, unindexed, unreachable; pipeline coverage\n"
    "(PC), semantic recall rate (SRR), ambient trigger rate (ATR); then why the probes missed.\n"
    "Broken agents first.",
    (AGENT,),
    lambda con, agent: queries.pipeline_health(con, agent),
)

RECALL_TREND = Question(
    ("query", "recall-trend"),
    "per agent: semantic recall rate (SRR) and ambient trigger rate (ATR) by day (hour, week) "
    "or by memory-count bucket: does recall decay over time, or as memory grows",
    "Per agent: semantic recall rate (SRR) and ambient trigger rate (ATR) by day (hour,\n"
    "week) or by memory-count bucket: does recall decay over time, or as memory grows?",
    (
        AGENT,
        Arg(
            "by",
            "UTC days (default), hours or weeks, or the agent's memory count at each "
            "probe (1, 2, 3-4, 5-8, ...)",
            flag="--by",
            choices=("day", "hour", "week", "memory-count"),
            default="day",
        ),
    ),
    lambda con, agent, by: queries.recall_trend(con, by, agent),
)

FAILED_SESSIONS = Question(
    ("query", "failed-sessions"),
    "the newest failed sessions, with their category, searches and ignored memories",
    "The newest failed sessions (rejected or rework) by their outcome's event time: agent,\n"
    "category, agent searches, followups, memories ignored and misleading. `memdiag explain\n"
    "SESSION_ID` tells one's story. " + _SINCE_DOC,
    (ORG, PROJECT, SINCE, limit(20)),
    lambda con, org, project, since, limit: queries.failed_sessions(
        con, org, project, since, limit
    ),
    empty=lambda rows: not rows,
)

DEAD_LETTERS = Question(
    ("query", "dead-letters"),
    "dead letters by reason, with the newest few of each and what to do",
    "Every input memdiag could not process, by reason (the most first): how many, the\n"
    "newest, a few samples (where it came from, the detail, the payload's start) and what to\n"
    "do about it.",
    (
        Arg("reason", "only this reason", flag="--reason"),
        Arg(
            "samples",
            "samples of each reason (default 3)",
            flag="--samples",
            parse=whole(0, "--samples"),
            default=3,
        ),
    ),
    lambda con, reason, samples: _dead_letters(con, reason, samples),
)


def _dead_letters(con: duckdb.DuckDBPyConnection, reason: str | None, samples: int) -> Any:
    """``--reason`` must be a reason memdiag gives or one the file holds: a typo would read
    as "every input was processed"."""
    from memdiag.analytics import queries
    from memdiag.contract import DEAD_LETTER_ADVICE

    found = queries.dead_letters(con, reason, samples)
    # "" is the advice for a reason memdiag does not know, not a reason: `--reason ""` (an
    # empty shell variable) is said, not read as "every input was processed"
    if found or reason is None or (reason and reason in DEAD_LETTER_ADVICE):
        return found
    held = queries.dead_letters(con, None, 0)
    here = ", ".join(f"{r['reason']} {r['dead_letters']:,}" for r in held) or "none"
    raise Usage(
        f"--reason {reason!r} is no dead-letter reason (those memdiag gives are in "
        f"docs/topics.md; this file holds: {here})"
    )


EXPLAIN = Question(
    ("explain",),
    "one session's story: searches, turns, outcome, misleading memories",
    "Everything DuckDB knows of one session, in event time: each search with its\n"
    "followup verdict and why (its predecessor and the gap), each evaluated turn with\n"
    "every injected memory used or ignored (match ratio: matched of its keywords), the outcome\n"
    "with its failure category and the rule that fired, and the weight step the session\n"
    "gave each memory, the misleading ones first. Says 'never searched' when the agent\n"
    "did not ask its memory, and lists the session's inputs memdiag could not take (its\n"
    "dead letters, with their reasons). An unknown id lists sessions that exist.",
    (
        Arg("session_id", "the session", metavar="SESSION_ID"),
        Arg(
            "html",
            "also write it as a self-contained HTML page",
            flag="--html",
            metavar="FILE",
            fetch=False,
        ),
    ),
    _explain,
)

EXPLAIN_MEMORY = Question(
    ("explain-memory",),
    "one memory's recall story: written, indexed, reachable, its probes and what outranked it",
    "Everything DuckDB knows of one memory of one agent (memory ids are an agent's own):\n"
    "when it was written and indexed, its status and name key, whether a path reaches it\n"
    "(indexed, or in the agent's latest ambient context) or none does (unreachable), how\n"
    "many of the agent's memories are look-alikes of its name (the same name key, or half\n"
    "their tokens shared), and its probes, the latest first,\n"
    "each with why it missed (not_indexed, below_threshold, aliased, outranked) and the\n"
    "first k results that came back instead, the look-alikes marked. The latest miss says\n"
    "where to look: the indexer, the threshold, the names, the ranking. An unknown id\n"
    "lists the agent's memories whose latest probe missed.\n"
    "e.g.     memdiag explain-memory ep-proving-medqa-004 --agent proving-medqa",
    (
        Arg("memory_id", "the memory", metavar="MEMORY_ID"),
        Arg("agent", "the agent it belongs to", flag="--agent", metavar="AGENT_ID", required=True),
        Arg(
            "limit",
            "most probes shown (default 20)",
            flag="--limit",
            parse=whole(1, "--limit"),
            default=20,
        ),
    ),
    _explain_memory,
)

BREAKS = Question(
    ("breaks",),
    "do sessions fail more while their agent's memory pipeline is down?",
    "Joins each session's outcome, by its agent and event time, to the spans in which\n"
    "that agent's memory pipeline was down (no memory indexed within\n"
    "MEMDIAG_INDEX_DEADLINE_SECONDS of a write, until the next index: the view\n"
    "pipeline_break_spans), and compares the failure rate (rejected or rework) of the\n"
    "sessions during breaks with that of the sessions while healthy, for all agents and\n"
    "per agent: both rates, the difference in points with a 95% bootstrap interval (each\n"
    "side resampled apart, seeded; Newcombe's score interval when a side is at 0% or\n"
    "100%), and the ratio in --json. Sessions without an agent_id, or\n"
    "of agents that sent no memory events, are counted apart. A side with fewer than 20\n"
    "sessions is marked too few. Correlation, not cause: a break often comes with other\n"
    "trouble.",
    (_resamples(10_000), SEED),
    _breaks,
    needs_report=True,
)

CALIBRATE = Question(
    ("calibrate",),
    "how well followups, ignored memories and 'never searched' predict failed sessions",
    "Measures the live proxies against session outcomes, per session: precision, recall\n"
    "and lift of '>= 1 followup', '>= 1 ignored memory' and 'never searched' as\n"
    "predictors of a failed session, and the ROC AUC of the followup rate (over the\n"
    "sessions that searched), each with a seeded bootstrap interval over sessions; then\n"
    "the same for several followup windows, recomputed from the stored verdicts, with\n"
    "the share of resamples in which each window predicts best. Correlation only: see\n"
    "the README's 'Calibrating the proxies' for how to read it.\n"
    "With --events FILE.jsonl, the used/ignored verdicts of the file's turns are read both\n"
    "ways: memdiag's whole words and AgentOS's substrings, with how many flip and examples;\n"
    "and with the semantic rule at MEMDIAG_SIMILARITY_THRESHOLD (needs memdiag[semantic]):\n"
    "how many it turns from ignored to used, and the similarity of each keyword verdict.\n"
    "When the file holds semantic verdicts (MEMDIAG_DETECTOR=semantic), how many the\n"
    "similarity alone made used, and the similarity of each signal and rule.\n"
    "With --labels FILE.jsonl (no database), the keyword rule and the semantic rule\n"
    "(MEMDIAG_DETECTOR=semantic) against labelled (memory, response, used) pairs: precision,\n"
    "recall and F1 of 'used' over similarity thresholds, the threshold the 'tune' pairs\n"
    "suggest, and both rules on the 'test' pairs it never saw.",
    (
        Arg(
            "windows",
            "followup windows to compare, in seconds (default 10,30,60,120; the "
            "stream's AGENTMEMORY_FOLLOWUP_WINDOW_SECONDS is always added)",
            flag="--windows",
            parse=windows,
            default=(10.0, 30.0, 60.0, 120.0),
            metavar="S,S,...",
        ),
        Arg("org", "only sessions of this org_id", flag="--org", known="org"),
        Arg("project", "only sessions of this project_id", flag="--project", known="project"),
        Arg(
            "since",
            "only sessions whose outcome is at or after this time",
            flag="--since",
            parse=since,
        ),
        _resamples(2000),
        SEED,
        Arg(
            "by",
            "what the bootstrap resamples: sessions (default), or whole agents with all "
            "their sessions (sessions of one agent are not independent)",
            flag="--by",
            choices=("session", "agent"),
            default="session",
        ),
        Arg(
            "events",
            "also read the texts of this events file (the JSONL the runtime published) and "
            "count the used/ignored verdicts that AgentOS's substring matching, and the "
            "semantic rule, would flip",
            flag="--events",
            metavar="FILE.jsonl",
        ),
        Arg(
            "labels",
            "instead of the database: score both used/ignored rules on this file of labelled "
            'pairs, a JSON object a line: {"memory": ..., "response": ..., "used": true, '
            '"split": "tune" or "test"} (needs memdiag[semantic])',
            flag="--labels",
            metavar="FILE.jsonl",
        ),
    ),
    _calibrate,
    extras=("stream_window", "similarity_threshold"),
    needs_report=True,
    needs_db=lambda v: v.get("labels") is None,
)

RUNS = Question(
    ("runs",),
    "list benchmark runs with their provenance: what makes two of them comparable",
    "Each run in DuckDB, newest first: its judged answers (the one that counts per\n"
    "question, condition and repeat), questions, conditions, repeats, re-judged answers\n"
    "(judged more than once), accuracy (each question weighs the same, however many\n"
    "repeats; conditions pooled: `report scores` gives each condition's), mean graded\n"
    "score, time span, and its provenance (run group, suite id,\n"
    "version and checksum, fixture checksum, config fingerprint, git head, service\n"
    "version). A field a run's judgements disagree on lists every value: the run mixes them.",
    (limit(50, "runs"),),
    lambda con, limit: queries.runs(con, limit),
)

DOCTOR = Question(
    ("doctor",),
    "before comparing runs: what would make the comparison weak",
    "Checks one run (or a baseline and a candidate) in DuckDB: too few questions, "
    "judgements\nwithout gold evidence, unattributed answers, repeats that disagree, a "
    "run that mixes\nsuites or configurations, re-judged answers, and for two runs: "
    "questions one side\nlacks, suite checksums that differ (they cannot be compared), "
    "an identical config\nfingerprint. Exit 0 when nothing weakens the comparison, 1 "
    "when something does, 2 on\nan error (or no data).",
    (
        Arg("run", "one run to check (or --baseline)", flag="--run", metavar="RUN"),
        *_two_runs(),
        Arg(
            "min_questions",
            "fewer distinct questions are too few (default 30)",
            flag="--min-questions",
            parse=whole(1, "--min-questions"),
            default=30,
            metavar="N",
        ),
    ),
    _doctor,
    status=lambda r: int(r["status"]),
    needs_report=True,
    error_exit=2,
)

COMPARE = Question(
    ("compare",),
    "compare two benchmark runs question by question: is the candidate better?",
    "Pairs the judgements of two runs by (question_id, repeat_index) and reports both\n"
    "accuracies and the delta, the exact McNemar p-value counting questions, not repeats\n"
    "(each question by the sign of its change in share of right repeats, ties left out), a\n"
    "paired bootstrap confidence interval of the delta (resampling questions with their\n"
    "repeats; seeded; significant only when both agree), where the answers moved between\n"
    "correct, reader failure and retrieval failure, latency and token deltas, and every\n"
    "unpaired question.\n"
    "Two conditions of one run compare with --baseline-condition/--candidate-condition.\n"
    "A harness that writes each repeat as its own run, sharing a run_group_id, compares\n"
    "with --baseline-group/--candidate-group: every run of the group is one repeat (in the\n"
    "order the runs started).\n"
    "Where the reader had all the gold evidence, the answers are also set apart by the best\n"
    "gold rank in the context and by the context's length, each side's correct rate per\n"
    "bucket: where the candidate's reader starts to miss evidence it was given.",
    (*_two_runs(), _resamples(10_000), SEED),
    _compare,
    needs_report=True,
)

SCORES = Question(
    ("report", "scores"),
    "one benchmark run's scores.json: accuracy, reader vs retrieval failures",
    "Per condition of the run: questions, correct, accuracy, and the wrong answers "
    "split into reader failures (the gold evidence was in the context), retrieval "
    "failures (it was not) and unattributed (no gold evidence). Repeats of a question "
    "are folded (each weighs 1/n) and their spread shown. Each metric (accuracy, "
    "recall_at_1/5/10 and mrr of the gold evidence in the ranked context, the graded "
    "score, latency_ms, tokens, input_tokens, output_tokens) with its mean, a 95% "
    "bootstrap interval over questions and its stdev across repeats; with several "
    "conditions, each paired against the baseline condition. The file's JSON Schema "
    "is schemas/scores.schema.json.",
    (
        Arg(
            "run_id",
            "the benchmark run",
            flag="--run-id",
            metavar="RUN",
            required=True,
            known="run",
        ),
        Arg("out", "write scores.json here", flag="--out", metavar="FILE", fetch=False),
        Arg(
            "baseline_condition",
            "pair every other condition against this one (default: the "
            "condition named 'baseline', if the run has it)",
            flag="--baseline-condition",
            metavar="C",
        ),
    ),
    _scores,
    extras=("db",),
    needs_report=True,
)

GATE = Question(
    ("gate",),
    "a release verdict: did the candidate regress beyond a policy? (exit 0/1/2)",
    "Pairs the judgements of two runs by (question_id, repeat_index), as compare does, and\n"
    "judges each metric of the policy on the 95% paired bootstrap interval of candidate -\n"
    "baseline (10,000 resamples over questions, seed 0), not on the point estimate:\n"
    "accuracy, recall_at_1/5/10, mrr and score regress when the lower bound is below\n"
    "-max_regression; latency_ms, tokens, input_tokens and output_tokens when the upper\n"
    "bound is above +max_regression.\n\n"
    "Exit 0: no regression beyond the policy. Exit 1: a judged regression, and only that\n"
    "(unlike other commands, where 1 is an error). Exit 2: anything else: cannot judge\n"
    "(too few paired questions or repeats, a different suite_checksum, a metric no pair\n"
    "carries, no data) or an error (usage, bad policy, unreadable database). Each exit\n"
    "ends with a one-line reason. A metric that regressed while another could not be\n"
    'judged is 2 as well (the policy was not judged whole): treat 2 as "not released"\n'
    "and read the reason; never retry it blindly.\n\n"
    "The policy (TOML):\n\n"
    "    [sample]\n"
    "    min_questions = 30          # distinct paired question_ids, required\n"
    "    min_repeats = 3             # paired repeats of every question, optional\n"
    "    require_reviewed = true     # only questions with reviewed labels, optional\n"
    '    split = "held_out"          # only judgements of this split, optional\n'
    "    [metrics.accuracy]\n"
    "    max_regression = 0.02       # fractions 0-1; latency_ms in ms; tokens in tokens\n"
    "    [provenance]\n"
    '    same_config = "note"        # or "refuse": both runs with one config_fingerprint\n'
    '    same_fixture = "refuse"     # or "note": a different fixture_checksum\n\n'
    "Each side is a run (--baseline RUN) or a run group (--baseline-group G: every run of\n"
    "the run_group_id is one repeat).",
    (
        *_two_runs(),  # checked by the gate: --explain needs neither
        Arg(
            "policy", "the policy, TOML (required)", flag="--policy", metavar="FILE", parse=_policy
        ),
        Arg(
            "markdown",
            "also write a Markdown summary a CI job can post as-is",
            flag="--markdown",
            metavar="FILE",
            fetch=False,
        ),
        Arg(
            "explain",
            "print the policy in words and exit (needs only --policy)",
            flag="--explain",
            switch=True,
        ),
    ),
    _gate,
    status=lambda v: int(v.status),
    needs_db=lambda v: False,  # it opens the file itself (``connect``), within its exits
    extras=("db", "connect"),
    on_error=lambda reason: _gate_error(reason),
)

#: every question, in the order of ``memdiag --help``
QUESTIONS: tuple[Question, ...] = (
    FAILURE_DISTRIBUTION,
    MISLEADING,
    UNUSED_MEMORIES,
    OBSERVATION_STATS,
    OBSERVATION_HISTORY,
    PIPELINE_HEALTH,
    RECALL_TREND,
    FAILED_SESSIONS,
    DEAD_LETTERS,
    EXPLAIN,
    EXPLAIN_MEMORY,
    BREAKS,
    CALIBRATE,
    SCORES,
    RUNS,
    DOCTOR,
    COMPARE,
    GATE,
    STATUS,
)
BY_COMMAND = {q.command: q for q in QUESTIONS}


# -- what each page of `memdiag serve` asks: several questions, one connection ----------------


def overview(
    con: duckdb.DuckDBPyConnection,
    org: str | None = None,
    project: str | None = None,
    since: Any = None,
    failed: int = 10,
    proxies: Callable[..., Any] | None = None,
) -> dict[str, Any]:
    """The overview page: the status figures (with the filters), and the newest failed
    sessions. ``proxies(con, org, project, since)`` gives what calibrate says of the proxies
    (the view's keeps it a minute: it costs more than the rest of the page); by default it
    is computed."""
    from memdiag.analytics.status import RecallWatch, proxy_strength, status

    for kind, value in (("org", org), ("project", project)):
        ensure_known(con, kind, value)
    st = status(con, 5, 5, RecallWatch(), org, project, since, with_proxies=False,
                light_pipeline=True)  # fmt: skip
    st["proxies"] = (proxies or proxy_strength)(con, org=org, project=project, since=since)
    st["failed_sessions"] = queries.failed_sessions(con, org, project, since, failed)
    return st


def memory_page(
    con: duckdb.DuckDBPyConnection, memory_id: str, agent: str | None = None
) -> dict[str, Any]:
    """A memory's page: as an injected observation (its verdicts, weight and strength over
    time, the sessions it was in) and, with ``agent``, as a memory of that agent's recall
    pipeline (``explain-memory``). NotFound when it is neither."""
    from memdiag.analytics.lookup import lookup, not_found

    found, known, closest = lookup(con, "observation", memory_id)
    recall_agents = queries.recall_agents_of(con, memory_id)
    page: dict[str, Any] = {
        "id": memory_id,
        "agent": agent,
        "stats": None,
        "history": [],
        "steps": None,
        "recall": None,
        "recall_agents": recall_agents,
    }
    if agent is not None:
        page["recall"] = _explain_memory(con, memory_id, agent, 20)
    elif len(recall_agents) == 1:
        page["recall"] = _explain_memory(con, memory_id, recall_agents[0], 20)
    if found:
        page["stats"] = queries.observation_stats(con, memory_id)
        page["history"] = queries.observation_history(con, memory_id, 50)
        page["steps"] = queries.observation_steps(con, memory_id)
    elif page["recall"] is None and not recall_agents:
        raise not_found("observation", memory_id, known, closest)
    return page


def agent_page(con: duckdb.DuckDBPyConnection, agent_id: str) -> dict[str, Any]:
    """An agent's recall page: pipeline health, the trends over time and memory count, its
    break spans, unreachable memories and the sessions that ended during its breaks."""
    from memdiag.analytics.lookup import lookup

    ensure_known(con, "agent", agent_id)
    has_memory, _, _ = lookup(con, "memory_agent", agent_id)
    page: dict[str, Any] = {"agent_id": agent_id, "memory_events": has_memory}
    if not has_memory:
        page["failed_sessions"] = queries.failed_sessions(con, limit=20)
        return page
    from memdiag.analytics.status import RecallWatch, recall_judgement

    page["health"] = queries.pipeline_health(con, agent_id)[0]
    judged = recall_judgement(con, RecallWatch())
    page["recall_fell"] = [r for r in judged["fell"] if r["agent_id"] == agent_id]
    page["stopped_probing"] = [r for r in judged["stopped"] if r["agent_id"] == agent_id]
    page["breaks"] = queries.agent_breaks(con, agent_id)
    page["unindexed"] = queries.unindexed_memories(con, agent_id, 100)
    page["sessions_during_breaks"] = queries.sessions_during_breaks(con, agent_id, 50)
    return page


def runs_page(
    con: duckdb.DuckDBPyConnection,
    baseline: str | None,
    candidate: str | None,
    baseline_condition: str | None,
    candidate_condition: str | None,
    policy: str,
    baseline_group: str | None = None,
    candidate_group: str | None = None,
) -> dict[str, Any]:
    """The runs page: every run with its provenance; with two sides chosen (each a run or a
    run group), what ``compare`` and ``gate`` (under ``policy``) say of them, the gate
    quoting what ``doctor`` finds."""
    from memdiag.analytics import gate as g
    from memdiag.analytics.scores import UnknownRun

    page: dict[str, Any] = {"runs": queries.runs(con, 200), "comparison": None, "verdict": None,
                            "error": None}  # fmt: skip
    if (baseline or baseline_group) and (candidate or candidate_group):
        for kind, given in (("run", baseline), ("run", candidate), ("run_group", baseline_group),
                            ("run_group", candidate_group)):  # fmt: skip
            ensure_known(con, kind, given)
        try:
            page["comparison"] = _compare(con, baseline, candidate, baseline_group,
                                          candidate_group, baseline_condition,
                                          candidate_condition, 10_000, 0)  # fmt: skip
        except (UnknownRun, Usage) as exc:  # several conditions and none chosen, ...
            page["error"] = str(exc)
        page["verdict"] = g.verdict_of(
            lambda: con.cursor(),
            baseline,
            candidate,
            baseline_condition,
            candidate_condition,
            policy,
            baseline_group=baseline_group,
            candidate_group=candidate_group,
        )
    return page
