"""Counters: OpenTelemetry (isolated provider), the counter topic's shapes, rollups, and
the alert rules that read them."""

from __future__ import annotations

import json

import jsonschema
import orjson
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from memdiag.alert import Alert, Evaluator, RuleError, parse_rule, parse_rules_file
from memdiag.contract import COUNTER_ATTRIBUTES as ATTRIBUTES
from memdiag.contract import COUNTER_HELP as HELP
from memdiag.contract import FEEDBACK, FEEDBACK_RETRACTED, FOLLOWUPS, SEARCH_CALLS
from memdiag.contract.envelope import DictStore, InMessage
from memdiag.schemas import load_schema
from memdiag.schemas.decode import parse_ts
from memdiag.settings import Settings
from memdiag.streams.metrics import Counters, views
from memdiag.streams.stages.counters import MINUTE_US, CounterStage, increments
from memdiag.streams.stages.sessions import SessionStage

CONTRACT_COUNTERS = {
    "agentmemory.smart_search.calls_total",
    "agentmemory.smart_search.followup_within_window_total",
    "agentmemory.retrieval_feedback_total",
    "agentmemory.session_outcome_total",
    "agentmemory.misleading_observation_total",
    "agentmemory.reader_failure_with_evidence_total",
    "agentmemory.retrieval_failure_total",
    "memdiag.dead_letter_total",
}


def test_every_contract_counter_has_a_help_text_that_says_how_it_miscounts() -> None:
    assert CONTRACT_COUNTERS <= set(HELP)
    assert set(ATTRIBUTES) == set(HELP)
    for name, text in HELP.items():
        assert "count" in text and len(text) > 80, name
    assert (
        "overcounts genuine query refinement" in HELP[FOLLOWUPS].lower()
        or "Overcounts genuine" in HELP[FOLLOWUPS]
    )
    assert (
        "long window overcounts" in HELP[FOLLOWUPS] and "short one undercounts" in HELP[FOLLOWUPS]
    )


def spike(n: int, start_s: int = 0, followups: bool = True) -> list[dict]:
    """n agent searches 2 s apart; each a followup of the previous when ``followups``."""
    out = []
    for i in range(n):
        t = start_s + 2 * i
        out.append(
            {
                "kind": "search",
                "event_id": f"e{start_s}-{i}",
                "ts": f"2026-11-21T09:{t // 60:02d}:{t % 60:02d}Z",
                "session_id": "s1",
                "query": f"q{i}" if followups else "same",
                "result_ids": [f"o{i}" if followups else "o"],
            }
        )
    return out


def test_a_followup_spike_shows_on_the_opentelemetry_exporter() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], views=views())
    counters = Counters(provider.get_meter("memdiag"))
    p = SessionStage(Settings(), lambda _: 0)
    out = p.process(
        [InMessage("memdiag.events", 0, 0, b"s1", json.dumps(spike(10)).encode(), None)],
        DictStore(),
    )
    counters.add_all(out.counts)
    points = {
        m.name: [(dict(dp.attributes), dp.value) for dp in m.data.data_points]
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert points[FOLLOWUPS] == [({}, 9)]
    assert points[SEARCH_CALLS] == [({"source": "agent"}, 10)]
    provider.shutdown()


def test_views_drop_foreign_attributes_and_cap_cardinality() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], views=views())
    counter = provider.get_meter("t").create_counter(
        "agentmemory.reader_failure_with_evidence_total"
    )
    for i in range(500):
        counter.add(1, {"run_id": f"run-{i}", "secret": "x"})
    [metric] = [
        m
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    ]
    attrs = [dict(dp.attributes) for dp in metric.data.data_points]
    assert all("secret" not in a for a in attrs)
    assert len(attrs) <= 201  # the cap, plus one overflow point
    assert sum(dp.value for dp in metric.data.data_points) == 500
    provider.shutdown()


def test_increments_and_rollups_follow_their_schema() -> None:
    schema = load_schema("counter")
    records = increments(
        {(FOLLOWUPS, ()): 3, (SEARCH_CALLS, (("source", "agent"),)): 5}, 1_795_000_000_000_000
    )
    rollups = CounterStage()
    store = DictStore()
    for key, record in records:
        jsonschema.validate(record, schema)
        assert key == record["name"]
        out = rollups.process(
            [InMessage("memdiag.counters", 0, 0, key.encode(), orjson.dumps(record), 0)], store
        )
        [(rkey, rollup)] = out.counter_messages
        jsonschema.validate(rollup, schema)
        assert rollup["value"] == record["value"] and rkey == record["name"]


def test_rollups_add_up_per_minute_of_event_time_and_ignore_their_own_output() -> None:
    r = CounterStage()
    store = DictStore()

    def inc(value: int, ts: str) -> dict:
        rec = {"type": "increment", "name": FOLLOWUPS, "value": value, "attributes": {}, "ts": ts}
        [(_, rollup)] = r.process(
            [InMessage("c", 0, 0, b"k", orjson.dumps(rec), 0)], store
        ).counter_messages
        return rollup

    assert inc(2, "2026-11-21T09:30:05Z")["value"] == 2
    assert inc(3, "2026-11-21T09:30:59.999Z")["value"] == 5
    later = inc(1, "2026-11-21T09:31:00Z")
    assert (later["minute"], later["value"]) == ("2026-11-21T09:31:00.000000Z", 1)
    assert inc(4, "2026-11-21T09:30:30Z")["value"] == 9  # a late increment for an open minute
    rollup_msg = orjson.dumps({**later, "type": "rollup"})
    assert r.process([InMessage("c", 0, 0, b"k", rollup_msg, 0)], store).counter_messages == []
    # hours later in event time, a verdict taken back in 09:30 still lands on its total
    assert inc(1, "2026-11-22T08:00:00Z")["value"] == 1
    assert inc(1, "2026-11-21T09:30:01Z")["value"] == 10
    # past the window (48 h behind the newest minute): not rolled up, never a smaller total
    assert inc(1, "2026-11-23T10:00:00Z")["value"] == 1
    rec = {"type": "increment", "name": FOLLOWUPS, "value": 1, "attributes": {},
           "ts": "2026-11-21T09:30:02Z"}  # fmt: skip
    assert (
        r.process([InMessage("c", 0, 0, b"k", orjson.dumps(rec), 0)], store).counter_messages == []
    )
    assert r.too_old == 1
    assert not any(k.endswith(str(parse_ts("2026-11-21T09:30:00Z"))) for k in store.data)


def test_rollups_kept_in_the_old_shape_carry_on() -> None:
    """A state written before the minutes had a key each: one value of every minute."""
    r = CounterStage()
    store = DictStore()
    key = FOLLOWUPS + "\0{}"
    m = parse_ts("2026-11-21T09:30:00Z")
    store.put(key, orjson.dumps({str(m): 7, str(m + MINUTE_US): 2}))
    rec = {"type": "increment", "name": FOLLOWUPS, "value": 1, "attributes": {},
           "ts": "2026-11-21T09:30:40Z"}  # fmt: skip
    [(_, rollup)] = r.process(
        [InMessage("c", 0, 0, b"k", orjson.dumps(rec), 0)], store
    ).counter_messages
    assert rollup["value"] == 8
    assert orjson.loads(store.get(key)) == [m, m + MINUTE_US]


def test_rule_parsing() -> None:
    r = parse_rule("followup_rate > 0.3 for 5m")
    assert (r.fn, r.op, r.threshold, r.window_us) == ("ratio", ">", 0.3, 5 * MINUTE_US)
    assert r.series[1].filters == (("source", "agent"),)
    r = parse_rule("rate(dead_letter_total{reason=not_json}) >= 2")
    assert r.series[0].name == "memdiag.dead_letter_total" and r.window_us == 5 * MINUTE_US
    r = parse_rule(
        "ratio(retrieval_feedback_total{signal=ignored}, retrieval_feedback_total) > 0.8 for 1h"
    )
    assert r.window_us == 60 * MINUTE_US
    for bad, message in [
        ("followup_rate", "EXPR OP NUMBER"),
        ("nonsense > 1", "neither an alias"),
        ("count(nope_total) > 1", "unknown counter"),
        ("ratio(calls_total) > 1", "two series"),
        ("count(calls_total) > 1 for 30s", "at least 1m"),
    ]:
        with pytest.raises(RuleError, match=message):
            parse_rule(bad)


def test_rules_file() -> None:
    rules = parse_rules_file(
        "# on-call rules\nfollowups: followup_rate > 0.3 for 5m\n\ncount(misleading_observation_total) > 0  # any\n"
    )
    assert [r.title for r in rules] == ["followups", "count(misleading_observation_total) > 0"]
    with pytest.raises(RuleError, match="line 2"):
        parse_rules_file("dead_letters > 1\nbroken")


def rollup(name: str, minute: int, value: int, **attrs: str) -> tuple[dict, int]:
    m = parse_ts("2026-11-21T09:00:00Z") + minute * MINUTE_US
    return {"type": "rollup", "name": name, "attributes": attrs, "value": value}, m


def test_a_rule_fires_and_resolves_in_event_time() -> None:
    ev = Evaluator([parse_rule("followup_rate > 0.3 for 5m")])
    calls, fups = "agentmemory.smart_search.calls_total", FOLLOWUPS
    states = []
    for minute in range(20):
        spike_minute = 5 <= minute < 8
        ev.add(*rollup(calls, minute, 10, source="agent"))
        ev.add(*rollup(calls, minute, 50, source="viewer"))  # viewer searches never count
        if spike_minute:
            ev.add(*rollup(fups, minute, 9))
        elif minute % 2:
            ev.add(*rollup(fups, minute, 1))
        states += [(a.state, minute, round(a.value or 0, 3)) for a in ev.evaluate()]
    # fires when the spike enters the 5-minute window, resolves once enough of it left
    assert states == [("firing", 6, 0.38), ("resolved", 11, 0.22)]


def test_ratio_without_denominator_does_not_fire() -> None:
    ev = Evaluator([parse_rule("followup_rate > 0.3")])
    ev.add(*rollup(FOLLOWUPS, 0, 5))
    assert ev.evaluate() == []
    assert ev.value(ev.rules[0]) is None


def test_ignored_share_is_net_of_the_verdicts_taken_back() -> None:
    """A late response turned 3 ignored verdicts of minute 0 into used ones of minute 1: the
    retractions are booked in minute 0, so the share is that of the verdicts that stand."""
    ev = Evaluator([parse_rule("ignored_share > 0.5 for 5m")])
    fb, back = FEEDBACK, FEEDBACK_RETRACTED
    ev.add(*rollup(fb, 0, 4, signal="ignored"))
    ev.add(*rollup(fb, 0, 1, signal="used"))
    assert ev.value(ev.rules[0]) == pytest.approx(4 / 5)
    ev.add(*rollup(back, 0, 3, signal="ignored"))
    ev.add(*rollup(fb, 1, 3, signal="used"))
    assert ev.value(ev.rules[0]) == pytest.approx(1 / 5)  # 1 ignored, 4 used stand
    assert [a.state for a in ev.evaluate()] == []
    # a take-back whose count was lost (a minute restarted): never a negative share
    low = Evaluator([parse_rule("ignored_share < 0.1")])
    low.add(*rollup(back, 0, 1, signal="ignored"))
    low.add(*rollup(fb, 0, 2, signal="used"))
    assert low.value(low.rules[0]) == 0.0  # not -1 / 1
    low.add(*rollup(back, 0, 3, signal="used"))
    assert low.value(low.rules[0]) is None  # nothing stands: no share at all
    # any series may be net of others; a filter's value may hold a minus sign
    r = parse_rule("count(dead_letter_total{reason=bad-ts} - dead_letter_total) > 1")
    (net,) = r.series
    assert net.filters == (("reason", "bad-ts"),) and [m.name for m in net.minus] == [
        "memdiag.dead_letter_total"
    ]


def test_count_and_rate() -> None:
    ev = Evaluator(
        [
            parse_rule("count(dead_letter_total) >= 3 for 2m"),
            parse_rule("rate(dead_letter_total) > 0.02 for 2m"),
        ]
    )
    ev.add(*rollup("memdiag.dead_letter_total", 0, 2, reason="not_json"))
    ev.add(*rollup("memdiag.dead_letter_total", 1, 1, reason="bad_ts"))
    ev.add(*rollup("memdiag.dead_letter_total", 1, 2, reason="bad_ts"))  # the later rollup wins
    assert [round(ev.value(r), 4) for r in ev.rules] == [4.0, round(4 / 120, 4)]
    assert [a.state for a in ev.evaluate()] == ["firing", "firing"]


def test_exporters_are_chosen_by_the_standard_variable(monkeypatch, caplog) -> None:
    import socket

    from memdiag.streams import telemetry

    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    assert telemetry._readers() == []
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "console,bogus")
    readers = telemetry._readers()
    assert [type(r).__name__ for r in readers] == ["PeriodicExportingMetricReader"]
    assert "bogus" in caplog.text
    for r in readers:
        r.shutdown()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "prometheus")
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_HOST", "127.0.0.1")
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", str(port))
    [reader] = telemetry._readers()
    assert type(reader).__name__ == "PrometheusMetricReader"
    provider = MeterProvider(metric_readers=[reader], views=views())
    Counters(provider.get_meter("memdiag")).add_all({(FOLLOWUPS, ()): 4})
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:  # noqa: S310
        body = r.read().decode()
    assert "agentmemory_smart_search_followup_within_window_total" in body
    assert " 4.0" in body
    provider.shutdown()


def test_a_backlog_in_any_order_replays_the_same_alerts() -> None:
    import random

    rule = "followup_rate > 0.3 for 5m"
    calls = "agentmemory.smart_search.calls_total"
    rollups = []
    for minute in range(20):
        rollups.append(rollup(calls, minute, 10, source="agent"))
        rollups.append(rollup(FOLLOWUPS, minute, 9 if 5 <= minute < 8 else 1))
    expected = None
    for seed in range(5):
        shuffled = list(rollups)
        random.Random(seed).shuffle(shuffled)  # noqa: S311 - test data
        ev = Evaluator([parse_rule(rule)])
        for doc, minute in shuffled:
            ev.add(doc, minute)
        got = [(a.state, a.at_us) for a in ev.replay()]
        assert got and [s for s, _ in got] == ["firing", "resolved"]
        expected = expected or got
        assert got == expected


def test_pipeline_coverage_fires_while_memories_go_unindexed_and_resolves_after() -> None:
    """The alias alone: some agent's unindexed_memory_total grew within the window."""
    rule = parse_rule("pipeline_coverage for 10m")
    assert (rule.fn, rule.op, rule.threshold) == ("count", ">", 0.0)
    assert parse_rule("pipeline_coverage > 3").threshold == 3.0
    ev = Evaluator([rule])
    name = "memdiag.unindexed_memory_total"
    states = []
    for minute in range(40):
        ev.add(*rollup("memdiag.dead_letter_total", minute, 1, reason="not_json"))  # time goes on
        if 12 <= minute < 15:
            ev.add(*rollup(name, minute, 2, agent_id="indexer-orphaned"))
        states += [(a.state, minute) for a in ev.evaluate()]
    # fires with the first unindexed memory, resolves after a window (10 min) with none
    assert states == [("firing", 12), ("resolved", 24)]
    with pytest.raises(RuleError):
        parse_rule("followup_rate for 5m")  # only pipeline_coverage stands alone
    with pytest.raises(RuleError, match="write it alone"):
        parse_rule("pipeline_coverage < 0.9")  # a count, not a coverage: "<" would invert it
    for always_or_never in (
        "pipeline_coverage >= 0",
        "pipeline_coverage > -1",
        "pipeline_coverage <= 3",
    ):
        with pytest.raises(RuleError, match="write it alone"):
            parse_rule(always_or_never)
    assert parse_rule("pipeline_coverage >= 1").threshold == 1.0
    assert parse_rule("pipeline_coverage for 10 m").window_us == 10 * 60_000_000  # as EXPR's


def test_recall_probe_miss_fires_and_resolves_per_agent() -> None:
    """The alias is grouped by agent: each agent's share of missed probes, apart. One agent
    whose probes start to miss fires alone (the other's hits do not dilute it), resolves when
    its probes hit again; an agent that goes quiet while firing resolves a window later."""
    rule = parse_rule("recall_probe_miss > 0.5 for 10m")
    assert (rule.fn, rule.by, rule.op, rule.threshold) == ("ratio", ("agent_id",), ">", 0.5)
    ev = Evaluator([rule])
    name = "memdiag.recall_probe_total"
    states = []
    for minute in range(60):
        ev.add(*rollup(name, minute, 20, agent_id="healthy", hit="true"))  # always hits
        ev.add(*rollup(name, minute, 1, agent_id="healthy", hit="false"))
        if minute < 40:  # garbage indexed from minute 10 to 19, then repaired; quiet from 40
            broken = 10 <= minute < 20
            ev.add(*rollup(name, minute, 1 if broken else 4, agent_id="garbage", hit="true"))
            ev.add(*rollup(name, minute, 4 if broken else 0, agent_id="garbage", hit="false"))
        if minute == 45:
            ev.add(*rollup(name, minute, 3, agent_id="quiet", hit="false"))
        states += [(a.state, dict(a.group), minute, a.value) for a in ev.evaluate()]
    # garbage: a broken minute has 4 misses of 5 probes, a good one 4 hits: the 10-minute
    # window's share is 20/45 at 14, 24/46 at 15 (fires); 24/46 at 23, 20/45 at 24 (resolves)
    assert [(s, g, m) for s, g, m, _ in states] == [
        ("firing", {"agent_id": "garbage"}, 15),
        ("resolved", {"agent_id": "garbage"}, 24),
        ("firing", {"agent_id": "quiet"}, 45),
        ("resolved", {"agent_id": "quiet"}, 55),  # a window without its probes: no value
    ]
    assert states[0][3] == pytest.approx(24 / 46) and states[-1][3] is None
    d = Alert(rule, "firing", 0.6, 0, (("agent_id", "garbage"),)).as_dict()
    assert d["group"] == {"agent_id": "garbage"}
    assert "group" not in Alert(parse_rule("misleading > 0"), "firing", 1.0, 0).as_dict()


def test_a_grouped_backlog_in_any_order_replays_the_same_alerts() -> None:
    import random

    rule = parse_rule("ratio(memdiag.recall_probe_total{hit=false}, recall_probe_total) "
                      "by agent_id >= 0.5 for 5m")  # fmt: skip
    name = "memdiag.recall_probe_total"
    rollups = []
    for minute in range(30):
        for n, agent in enumerate(("a", "b", "c")):
            missing = n * 5 <= minute < n * 5 + 8
            rollups.append(rollup(name, minute, 3 if missing else 0, agent_id=agent, hit="false"))
            rollups.append(rollup(name, minute, 1, agent_id=agent, hit="true"))
    expected = None
    for seed in range(5):
        shuffled = list(rollups)
        random.Random(seed).shuffle(shuffled)  # noqa: S311 - test data
        ev = Evaluator([rule])
        for doc, minute in shuffled:
            ev.add(doc, minute)
        got = [(a.state, a.group, a.at_us) for a in ev.replay()]
        assert sorted({g for _, g, _ in got}) == [(("agent_id", x),) for x in "abc"]
        assert [s for s, g, _ in got if g == (("agent_id", "a"),)] == ["firing", "resolved"]
        expected = expected or got
        assert got == expected


def test_by_parses_and_groups_by_several_attributes() -> None:
    rule = parse_rule("count(memdiag.recall_probe_total) by agent_id, hit > 2")
    assert rule.by == ("agent_id", "hit")
    ev = Evaluator([rule])
    name = "memdiag.recall_probe_total"
    for _ in range(2):
        ev.add(*rollup(name, 0, 3, agent_id="a", hit="false"))
        ev.add(*rollup(name, 0, 1, agent_id="a", hit="true"))
        ev.add(*rollup(name, 0, 9, agent_id="b"))  # lacks `hit`: in no group
    alerts = ev.evaluate()
    assert [(a.state, a.group) for a in alerts] == [
        ("firing", (("agent_id", "a"), ("hit", "false")))
    ]
    with pytest.raises(RuleError):
        parse_rule("count(memdiag.dead_letter_total) by > 2")
    # ungrouped rules sum every attribute set
    ev2 = Evaluator([parse_rule("count(memdiag.dead_letter_total) > 12")])
    ev2.add(*rollup(DEAD_LETTER_NAME, 0, 3, reason="not_json", topic="t1"))
    ev2.add(*rollup(DEAD_LETTER_NAME, 0, 10, reason="bad_value"))
    assert [a.group for a in ev2.evaluate()] == [()]


DEAD_LETTER_NAME = "memdiag.dead_letter_total"


def test_the_counter_schema_names_every_counter() -> None:
    assert set(load_schema("counter")["$defs"]["name"]["enum"]) == set(HELP)


def test_by_an_attribute_no_counter_carries_is_refused() -> None:
    with pytest.raises(RuleError, match="by agent: no counter of the rule carries it"):
        parse_rule("ratio(recall_probe_total{hit=false}, recall_probe_total) by agent > 0.5")


def test_a_firing_alert_links_the_page_of_its_cause() -> None:
    """With MEMDIAG_SERVE_URL set: an agent's recall page for an alert of one agent, the
    misleading memories, the dead letters, the runs, else the overview; quoted ids."""
    base = "https://memdiag.internal:8765/"
    cases = [
        ("recall_probe_miss > 0.5", (("agent_id", "a b/c"),), "/agents/a%20b%2Fc"),
        ("misleading > 0", (), "/#misleading"),
        ("dead_letters > 0", (), "/dead-letters"),
        ("count(reader_failure_with_evidence_total) by run_id > 0", (("run_id", "r1"),),
         "/runs?baseline=r1"),
        ("pipeline_coverage", (), "/#cards"),
        ("followup_rate > 0.3", (), "/"),
    ]  # fmt: skip
    for text, group, path in cases:
        alert = Alert(parse_rule(text), "firing", 1.0, 0, group)
        assert alert.page() == path, text
        assert alert.as_dict(base)["page"] == "https://memdiag.internal:8765" + path
        assert "page" not in alert.as_dict()  # no MEMDIAG_SERVE_URL, no link


def test_unset_exports_nothing_and_a_collector_away_is_said_rarely(monkeypatch, caplog) -> None:
    """docs/topics.md: the counters are exported only when OTEL_METRICS_EXPORTER is set; a
    worker with only MEMDIAG_BROKER set logs one line, never a failed export per interval."""
    import logging

    from memdiag.streams import telemetry

    monkeypatch.delenv("OTEL_METRICS_EXPORTER", raising=False)
    with caplog.at_level(logging.INFO, "memdiag.telemetry"):
        assert telemetry._readers() == []
    assert "OTEL_METRICS_EXPORTER unset" in caplog.text
    now = [0.0]
    quiet = telemetry.Quieter(every=600, clock=lambda: now[0])
    said = []
    for t in (0, 60, 120, 599, 601, 700, 1300):
        now[0] = t
        record = logging.LogRecord(
            "x", logging.WARNING, "f", 1, "export to %s failed", ("c",), None
        )
        if quiet.filter(record):
            said.append(record.getMessage())
    assert said == [
        "export to c failed",
        "export to c failed (3 more not logged in the last 601 s)",
        "export to c failed (1 more not logged in the last 699 s)",
    ]
    info = logging.LogRecord("x", logging.INFO, "f", 1, "fine", (), None)
    assert quiet.filter(info)  # below a warning: never held back
