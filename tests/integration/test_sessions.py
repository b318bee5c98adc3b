"""Turns, session diagnostics, misleading memories and weights, through the real broker."""

from __future__ import annotations

import time

import pytest
from aiokafka.partitioner import murmur2

from tests.integration.conftest import Pipeline

pytestmark = pytest.mark.integration

TS = "2026-11-21T10:00:00.000Z"
OBS_7 = {
    "id": "obs_7",
    "content": "Access tokens expire after 15 minutes; the refresh endpoint rotates them.",
}
OBS_9 = {"id": "obs_9", "content": "Session cookies are signed with the HMAC secret from vault."}
TEXT = (
    "The access tokens expire after 15 minutes, so the client calls the refresh endpoint, "
    "which rotates them."
)


def injection(sid: str, turn: str, observations: list[dict], eid: str | None = None) -> dict:
    return {
        "kind": "injection",
        "event_id": eid or f"{sid}-{turn}-i",
        "ts": TS,
        "session_id": sid,
        "org_id": "org_1",
        "turn_id": turn,
        "observations": observations,
    }


def response(sid: str, turn: str, text: str = TEXT) -> dict:
    return {
        "kind": "response",
        "event_id": f"{sid}-{turn}-r",
        "ts": "2026-11-21T10:00:05.000Z",
        "session_id": sid,
        "org_id": "org_1",
        "turn_id": turn,
        "text": text,
    }


def outcome(sid: str, result: str, ts: str = "2026-11-21T10:10:00.000Z") -> dict:
    return {
        "kind": "session_outcome",
        "event_id": f"{sid}-o",
        "ts": ts,
        "session_id": sid,
        "org_id": "org_1",
        "project_id": "proj_1",
        "outcome": result,
        "tool_calls": [{"tool": "pytest", "success": result == "accepted"}],
        "files_modified": ["a.py"],
        "errors": [],
    }


def partition(sid: str, partitions: int) -> int:
    return (murmur2(sid.encode()) & 0x7FFFFFFF) % partitions


def feedback(p: Pipeline, sid: str) -> dict[str, str]:
    rows = p.query(
        "SELECT observation_id, signal FROM retrieval_feedback "  # noqa: S608
        f"WHERE session_id = '{sid}'"
    )
    return dict(rows)


def test_the_turn_join_holds_in_both_orders(pipeline: Pipeline) -> None:
    pipeline.start()
    before, after, nokey = "ses-inj-first", "ses-resp-first", "ses-unkeyed"
    pipeline.publish(
        [
            (before.encode(), injection(before, "t1", [OBS_7, OBS_9, OBS_7])),
            (after.encode(), response(after, "t1")),
            (None, response(nokey, "t1")),  # unkeyed: re-routed, maybe behind its partner
        ]
    )
    pipeline.drain()  # the first halves are in state, alone, before their partners come
    assert feedback(pipeline, before) == {} and feedback(pipeline, after) == {}
    pipeline.publish(
        [
            (before.encode(), response(before, "t1")),
            (after.encode(), injection(after, "t1", [OBS_7, OBS_9])),
            (None, injection(nokey, "t1", [OBS_7, OBS_9])),
        ]
    )
    pipeline.drain()
    expected = {"obs_7": "used", "obs_9": "ignored"}
    for sid in (before, after, nokey):
        assert feedback(pipeline, sid) == expected, sid
    # exactly one row per distinct observation of the turn, with the contract's figures
    assert pipeline.query(
        "SELECT count(*), min(keyword_count), max(match_ratio) FROM retrieval_feedback "
        f"WHERE session_id = '{before}'"  # noqa: S608
    ) == [(2, 5, 1.0)]  # obs_9 has 5 keywords, obs_7 all 8 matched
    assert pipeline.query("SELECT DISTINCT detector, similarity FROM retrieval_feedback") == [
        ("keyword", None)
    ]  # the default rule: no similarity
    assert pipeline.query("SELECT * FROM observation_feedback_stats ORDER BY observation_id") == [
        ("obs_7", 3, 0),
        ("obs_9", 0, 3),
    ]


def test_the_semantic_rule_finds_a_paraphrase_through_the_broker(
    semantic_pipeline: Pipeline,
) -> None:
    """MEMDIAG_DETECTOR=semantic end to end: a paraphrased memory the words miss is used,
    with its similarity and its rule in DuckDB; the response comes first, so the worker
    judges from the vectors it kept in the session's state."""
    p = semantic_pipeline
    p.start()
    key = {"id": "obs_k", "content": "Rotate the signing key before the token expires."}
    said = "The auth token's signing secret must be rolled ahead of expiry."
    p.publish([(b"ses-sem", response("ses-sem", "t1", said))])
    p.drain()
    p.publish([(b"ses-sem", injection("ses-sem", "t1", [key, OBS_9]))])
    p.drain()
    rows = p.query(
        "SELECT observation_id, signal, match_ratio, similarity, detector "
        "FROM retrieval_feedback ORDER BY observation_id"
    )
    assert rows == [
        ("obs_9", "used", 0.2, 0.34444, "semantic"),  # the topic, not the use (docs/rules.md)
        ("obs_k", "used", 0.2, 0.56858, "semantic"),  # 1 of 5 keywords: the words say ignored
    ]


def sessions_on_every_partition(n: int, partitions: int) -> list[str]:
    found: dict[int, str] = {}
    i = 0
    while len(found) < min(n, partitions):
        found.setdefault(partition(f"shared-{i}", partitions), f"shared-{i}")
        i += 1
    return list(found.values())


def test_misleading_and_weights_across_partitions(pipeline: Pipeline) -> None:
    s = pipeline.settings
    sids = sessions_on_every_partition(4, s.events_partitions)
    assert len({partition(x, s.events_partitions) for x in sids}) == 4
    pipeline.start()
    good = "ses-good"  # obs_9 is in an accepted session first: never misleading after
    first = [
        (good.encode(), injection(good, "t1", [OBS_9])),
        (good.encode(), outcome(good, "accepted")),
    ]
    pipeline.publish(first)
    pipeline.drain()
    events = []
    for i, sid in enumerate(sids):
        events += [
            (sid.encode(), injection(sid, "t1", [{"id": "mislead", "content": "x"}, OBS_9])),
            (sid.encode(), response(sid, "t1")),
            (sid.encode(), outcome(sid, "rework" if i % 2 else "rejected")),
        ]
    pipeline.publish(events)
    pipeline.drain()

    rows = pipeline.query(
        "SELECT session_id, outcome, failure_category, misleading_observation_ids, "
        "ignored_observation_ids, injected_observation_ids FROM session_diagnostics "
        "ORDER BY ts, session_id"
    )
    by_sid = {r[0]: r[1:] for r in rows}
    assert by_sid[good] == ("accepted", None, [], [], ["obs_9"])
    for sid in sids:
        outcome_, category, misleading, ignored, injected = by_sid[sid]
        assert category == "test_failure"
        assert injected == ["mislead", "obs_9"]
        assert ignored == ["mislead", "obs_9"]
        assert "obs_9" not in misleading
    # "mislead" is in 4 failed sessions: the 3rd and 4th to be counted see it as misleading
    flagged = [sid for sid in sids if "mislead" in by_sid[sid][2]]
    assert len(flagged) == 2

    weights = dict(pipeline.query("SELECT observation_id, weight FROM observation_weights"))
    assert weights["mislead"] == pytest.approx(0.8 * 0.8 * 0.6 * 0.6)
    history = pipeline.query(
        "SELECT alpha, aggressive, previous_weight, new_weight FROM observation_weight_history "
        "WHERE observation_id = 'mislead' ORDER BY step"
    )
    assert [(a, g) for a, g, _, _ in history] == [
        (0.2, False),
        (0.2, False),
        (0.4, True),
        (0.4, True),
    ]
    assert all(history[i][3] == pytest.approx(history[i + 1][2]) for i in range(len(history) - 1))
    assert pipeline.query("SELECT * FROM misleading_observations()") == [("mislead", 4, 0)]
    dist = dict(pipeline.query("SELECT * FROM failure_category_distribution(org_id := 'org_1')"))
    assert dist["test_failure"] == 4 and len(dist) == 7

    # the memory system's view: one message per update on `weights`, keyed by observation.
    # The sessions share an outcome ts (ordered by session_id): one arriving out of that
    # order re-sends the steps after it, and the last message holds the current weight.
    steps = [
        (k, v)
        for k, v in pipeline.consume(s.topics.weights)
        if v["observation_id"] == "mislead" and v["kind"] == "observation_weight"
    ]  # the strengths share the topic and the key: a kind of their own, versions of their own
    assert {k for k, _ in steps} == {b"mislead"} and len(steps) >= 4
    final = {v["session_id"]: v["step"] for _, v in steps}
    assert sorted(final.values()) == [1, 2, 3, 4]
    assert steps[-1][1]["current_weight"] == pytest.approx(weights["mislead"])
    assert steps[-1][1]["current_misleading"] is True

    # replaying everything changes nothing in DuckDB
    before = pipeline.snapshot()
    pipeline.publish(first + events)
    pipeline.drain()
    assert pipeline.snapshot() == before


def test_a_worker_killed_between_the_halves_of_a_turn_still_joins_them(
    pipeline: Pipeline,
) -> None:
    pipeline.start()
    sid = "ses-crash"
    pipeline.publish([(sid.encode(), injection(sid, "t1", [OBS_7, OBS_9]))])
    pipeline.drain()
    time.sleep(pipeline.settings.commit_interval_seconds * 2)  # the changelog is written
    pipeline.kill("worker")
    pipeline.start("worker")
    pipeline.publish(
        [(sid.encode(), response(sid, "t1")), (sid.encode(), outcome(sid, "rejected"))]
    )
    pipeline.drain(timeout=90)
    assert feedback(pipeline, sid) == {"obs_7": "used", "obs_9": "ignored"}
    assert pipeline.query(
        "SELECT ignored_observation_ids FROM session_diagnostics "  # noqa: S608
        f"WHERE session_id = '{sid}'"
    ) == [(["obs_9"],)]


def test_an_event_id_reused_for_another_event_is_dead_lettered_through_the_broker(
    pipeline: Pipeline,
) -> None:
    """Within a session (the session stage) and within a run (the sink): the first event
    under an id stays, the other is a `reused_event_id` dead letter, once, also when
    everything is published again. Two sessions' searches under one id are two searches."""
    pipeline.start()
    sid, other_sid = "ses-reuse", "ses-reuse-2"
    search = {
        "kind": "search", "event_id": "ses-reuse-s1", "ts": TS, "session_id": sid,
        "query": "token expiry", "result_ids": ["obs_7"], "source": "agent",
    }  # fmt: skip
    judgement = {
        "kind": "judgement", "event_id": "j-1", "ts": TS, "run_id": "run-r", "question_id": "q1",
        "judge_correct": True, "gold_evidence_ids": ["g"], "retrieved_context_ids": ["g"],
    }  # fmt: skip
    first = [
        (sid.encode(), search),
        (sid.encode(), injection(sid, "t1", [OBS_7])),
        (sid.encode(), response(sid, "t1")),
    ]
    reused = [
        (sid.encode(), injection(sid, "t1", [OBS_9], eid=f"{sid}-t1-i")),  # the same session
        (other_sid.encode(), {**search, "session_id": other_sid}),  # another session
    ]
    judgements = pipeline.settings.topics.judgements
    for _ in range(2):  # published again: nothing more
        pipeline.publish(first)
        pipeline.publish([(b"run-r", judgement)], topic=judgements)
        pipeline.drain()
        pipeline.publish(reused)
        pipeline.publish([(b"run-r", {**judgement, "judge_correct": False})], topic=judgements)
        pipeline.drain()
    assert feedback(pipeline, sid) == {"obs_7": "used"}
    assert pipeline.query("SELECT session_id FROM searches ORDER BY 1") == [(sid,), (other_sid,)]
    assert pipeline.query("SELECT judge_correct FROM judgement_artifacts") == [(True,)]
    assert pipeline.query("SELECT judge_correct FROM judgements") == [(True,)]
    dead = pipeline.query("SELECT topic, reason, detail FROM dead_letters ORDER BY topic, detail")
    prefix = pipeline.settings.topic_prefix
    assert [(t, r) for t, r, _ in dead] == [
        (f"{prefix}events", "reused_event_id"),
        (f"{prefix}judgements", "reused_event_id"),
    ]
    details = " ".join(d for _, _, d in dead)
    assert "another injection event, which differs in observations;" in details
    assert "another judgement, which differs in judge_correct" in details
