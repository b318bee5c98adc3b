"""The followup rule as a pure function, and the event-time history built on it."""

from __future__ import annotations

import hashlib

from hypothesis import assume, given
from hypothesis import strategies as st

from memdiag.streams.rules.followup import (
    Remembered,
    SearchHistory,
    is_evaluated,
    judge,
    normalise_query,
    query_key,
)

WINDOW = 30_000_000  # 30 s in microseconds
RETENTION = 24 * 3600 * 1_000_000


def rem(eid: str, ts_s: float, query: str, ids: tuple[str, ...]) -> Remembered:
    return Remembered(round(ts_s * 1_000_000), eid, query_key(query), ids)


def test_contract_example_is_a_followup() -> None:
    prev = rem("ev-0001", 0.0, "auth flow", ("obs_1", "obs_2", "obs_3"))
    cur = rem("ev-0002", 12.25, "auth token expiry", ("obs_7", "obs_9"))
    v = judge(prev, cur, WINDOW, RETENTION)
    assert v.is_followup and v.prev_event_id == "ev-0001" and v.gap_seconds == 12.25


def test_same_query_again_is_a_retry_not_a_followup() -> None:
    prev = rem("a", 0, "Auth Flow", ("x",))
    cur = rem("b", 5, "  auth flow ", ("y",))
    v = judge(prev, cur, WINDOW, RETENTION)
    assert not v.is_followup and v.prev_event_id == "a" and v.gap_seconds == 5


def test_shared_result_is_not_a_followup() -> None:
    v = judge(rem("a", 0, "q1", ("x", "y")), rem("b", 5, "q2", ("y", "z")), WINDOW, RETENTION)
    assert not v.is_followup


def test_window_boundary_is_inclusive_to_the_millisecond() -> None:
    prev = rem("a", 0, "q1", ("x",))
    assert judge(prev, rem("b", 30.000, "q2", ("y",)), WINDOW, RETENTION).is_followup
    assert not judge(prev, rem("b", 30.001, "q2", ("y",)), WINDOW, RETENTION).is_followup


def test_earlier_than_the_remembered_search_is_not_a_followup() -> None:
    v = judge(rem("a", 10, "q1", ("x",)), rem("b", 9.999, "q2", ("y",)), WINDOW, RETENTION)
    assert not v.is_followup and v.gap_us == -1000


def test_remembered_search_past_retention_is_forgotten() -> None:
    v = judge(rem("a", 0, "q1", ("x",)), rem("b", 24 * 3600 + 1, "q2", ("y",)), WINDOW, RETENTION)
    assert v.prev_event_id is None and v.gap_us is None


def test_viewer_and_empty_searches_are_not_evaluated() -> None:
    assert is_evaluated("agent", ["x"])
    assert not is_evaluated("viewer", ["x"])
    assert not is_evaluated("agent", [])


def test_normalisation_trims_and_lowercases_only() -> None:
    assert normalise_query("  Auth FLOW\t") == "auth flow"
    assert normalise_query("auth  flow") != normalise_query("auth flow")


# -- properties ----------------------------------------------------------------------

ids = st.lists(st.sampled_from([f"o{i}" for i in range(8)]), max_size=4).map(tuple)
queries = st.sampled_from(["auth", "Auth ", "token", "db pool", "DB POOL", "deploy"])
gaps_ms = st.integers(min_value=0, max_value=120_000)


def observe(h: SearchHistory, eid: str, ts_us: int, q: str, r: tuple) -> list:
    return h.observe(Remembered(ts_us, eid, query_key(q), tuple(r)))


@given(queries, ids.filter(bool))
def test_a_first_search_is_never_a_followup(q: str, r: tuple[str, ...]) -> None:
    h = SearchHistory(WINDOW, RETENTION)
    v = observe(h, "e1", 1_000_000, q, r)
    assert v == [v[0]] and not v[0].is_followup and v[0].prev_event_id is None


@given(queries, ids, ids, gaps_ms)
def test_identical_queries_are_never_followups(q: str, a: tuple, b: tuple, gap: int) -> None:
    prev = Remembered(0, "a", query_key(q), a)
    cur = Remembered(gap * 1000, "b", query_key(f"  {q.upper()}  "), b)
    assert not judge(prev, cur, WINDOW, RETENTION).is_followup


@given(queries, queries, ids, ids, gaps_ms)
def test_verdict_matches_the_contract_definition(
    q1: str, q2: str, a: tuple, b: tuple, gap_ms: int
) -> None:
    prev = Remembered(0, "a", query_key(q1), a)
    cur = Remembered(gap_ms * 1000, "b", query_key(q2), b)
    expected = (
        0 <= gap_ms <= 30_000 and q1.strip().lower() != q2.strip().lower() and not (set(a) & set(b))
    )
    assert judge(prev, cur, WINDOW, RETENTION).is_followup is expected


@given(st.integers(min_value=0, max_value=10**15), st.integers(min_value=-5, max_value=5))
def test_boundary_exact_at_millisecond_precision(start_us: int, delta_ms: int) -> None:
    window_ms = 30_000
    prev = Remembered(start_us, "a", query_key("q1"), ("x",))
    cur = Remembered(start_us + (window_ms + delta_ms) * 1000, "b", query_key("q2"), ("y",))
    assert judge(prev, cur, WINDOW, RETENTION).is_followup is (delta_ms <= 0)


searches = st.lists(
    # few distinct event times: many searches share one, and their event ids decide
    st.tuples(st.integers(min_value=0, max_value=40), queries, ids.filter(bool)),
    min_size=1,
    max_size=14,
)


def in_event_time(events: list[tuple[str, int, str, tuple]]) -> list[tuple[str, int, str, tuple]]:
    """The contract's order of one session's events: ``ts``, then ``event_id`` bytes."""
    return sorted(events, key=lambda e: (e[1], e[0].encode()))


def final_verdicts(order: list[tuple[str, int, str, tuple]]) -> dict[str, tuple]:
    """Feed searches in the given arrival order; apply corrections like the sink does."""
    h = SearchHistory(WINDOW, RETENTION)
    rows: dict[str, tuple] = {}
    for eid, ts_s, q, r in order:
        for v in observe(h, eid, ts_s * 1_000_000, q, r):
            rows[v.event_id] = (v.is_followup, v.prev_event_id, v.gap_us)
    return rows


@given(searches, st.randoms(use_true_random=False))
def test_out_of_order_arrival_converges_to_the_in_order_verdicts(s: list, rnd) -> None:
    events = [(f"e-{i}", ts, q, r) for i, (ts, q, r) in enumerate(s)]  # e-10 before e-9
    in_order = final_verdicts(in_event_time(events))
    shuffled = list(events)
    rnd.shuffle(shuffled)
    assert final_verdicts(shuffled) == in_order


def test_equal_timestamps_are_taken_in_event_id_byte_order_whatever_the_arrival() -> None:
    for arrival in (["e-99", "e-100"], ["e-100", "e-99"]):
        h = SearchHistory(WINDOW, RETENTION)
        for n, eid in enumerate(arrival):
            observe(h, eid, 0, f"q{n}", (eid,))
        # "e-100" < "e-99" in byte order: e-100 is first, and e-99's predecessor
        assert h.verdict("e-100") == judge(None, rem("e-100", 0, "", ()), WINDOW, RETENTION)
        v = h.verdict("e-99")
        assert v is not None and v.is_followup and v.prev_event_id == "e-100" and v.gap_us == 0
        assert h.followups == 1


def test_late_search_corrects_its_successor() -> None:
    h = SearchHistory(WINDOW, RETENTION)
    observe(h, "a", 0, "q1", ("x",))
    observe(h, "c", 40_000_000, "q3", ("z",))  # 40 s after a: not a followup
    v = observe(h, "b", 20_000_000, "q2", ("y",))
    assert [x.event_id for x in v] == ["b", "c"]
    assert v[0].is_followup and v[0].prev_event_id == "a"
    assert v[1].is_followup and v[1].prev_event_id == "b" and v[1].gap_us == 20_000_000
    assert h.verdict("c") == v[1] and h.successor_verdict("b") == v[1]


HOUR = 3600 * 1_000_000


def test_pruning_keeps_the_predecessor_any_search_after_the_cut_off_needs() -> None:
    h = SearchHistory(WINDOW, RETENTION)
    for i in range(5):
        observe(h, f"e{i}", i * HOUR, f"q{i}", (f"r{i}",))
    h.prune(27 * HOUR + HOUR // 2 - RETENTION)  # the clock at 27.5 h: cut-off at 3.5 h
    assert [e.event_id for e in h.entries] == ["e3", "e4"]  # e3: the predecessor of e4
    assert h.verdict("e4") is not None and h.verdict("e4").prev_event_id == "e3"
    assert h.verdict("e1") is None and "e1" not in h
    # a search landing just after the cut-off still finds its predecessor
    v = observe(h, "late", 3 * HOUR + HOUR // 2 + 1, "q", ("r",))
    assert v[0].prev_event_id == "e3" and v[1].event_id == "e4"
    assert h.evaluated == 6


def test_state_keeps_no_query_text() -> None:
    h = SearchHistory(WINDOW, RETENTION)
    observe(h, "a", 0, "secret customer name", ("x",))
    assert "secret" not in repr(h.entries)


@given(st.text(), st.text())
def test_query_key_equals_iff_normalised_queries_equal(a: str, b: str) -> None:
    assume(a != b)
    assert (query_key(a) == query_key(b)) == (normalise_query(a) == normalise_query(b))


@given(searches, st.randoms(use_true_random=False))
def test_counts_equal_the_final_verdicts_in_any_order(s: list, rnd) -> None:
    """The session diagnostic's search and followup counts come from these counters."""
    events = [(f"e{i}", ts, q, r) for i, (ts, q, r) in enumerate(s)]
    shuffled = list(events)
    rnd.shuffle(shuffled)
    h = SearchHistory(WINDOW, RETENTION)
    rows: dict[str, bool] = {}
    for eid, ts, q, r in shuffled:
        for v in observe(h, eid, ts * 1_000_000, q, r):
            rows[v.event_id] = v.is_followup
    assert h.evaluated == len(events)
    assert h.followups == sum(rows.values())


@given(
    st.integers(0, 200_000_000),
    st.sampled_from(["q1", "Q1 ", "q2"]),
    st.sampled_from([("x",), ("x", "y"), ("y",), ("z", "w")]),
    st.sampled_from([10, 30, 60, 120]),
)
def test_a_followup_is_a_disjoint_new_query_within_the_window(
    gap_us: int, query: str, ids: tuple[str, ...], window_s: int
) -> None:
    """``memdiag calibrate`` recomputes any window from the stored ``disjoint_new_query`` and
    ``gap_seconds``: that must be exactly the stream's verdict under that window."""
    prev = rem("a", 0, "q1", ("x",))
    cur = Remembered(gap_us, "b", query_key(query), ids)
    window = window_s * 1_000_000
    v = judge(prev, cur, window, RETENTION)
    assert v.disjoint_new_query == (normalise_query(query) != "q1" and "x" not in ids)
    assert v.is_followup == (v.disjoint_new_query and v.gap_seconds <= window_s)


def test_no_predecessor_is_no_disjoint_new_query() -> None:
    assert not judge(None, rem("a", 0, "q", ("x",)), WINDOW, RETENTION).disjoint_new_query
    far = judge(rem("a", 0, "q1", ("x",)), rem("b", 24 * 3600 + 1, "q2", ("y",)), WINDOW, RETENTION)
    assert not far.disjoint_new_query


@given(st.text(max_size=300))
def test_a_query_key_is_the_8_byte_blake2b_of_the_normalised_query(query: str) -> None:
    """The state keeps this key, and a changelog written by any version is read by the
    next: a retry is a retry across an upgrade only if the key never changes."""
    expected = hashlib.blake2b(normalise_query(query).encode("utf-8"), digest_size=8)
    assert query_key(query) == expected.hexdigest()


def test_a_query_key_is_what_changelogs_hold() -> None:
    assert query_key("  Auth TOKEN ") == "59100a1d76e3aaf9"  # as the changelogs hold it
