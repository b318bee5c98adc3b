"""The stages' caches under one byte budget (MEMDIAG_DECODED_CACHE_MB, #38): eviction by
bytes, the least recently used first whatever its cache, and each cache's own count cap."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from memdiag.settings import Settings
from memdiag.streams.lru import DECODED_PER_ENCODED, Budget, shared_budget


def test_the_least_recently_used_goes_first_whatever_its_cache() -> None:
    budget = Budget(100 * DECODED_PER_ENCODED)
    sessions, ledgers = budget.cache("sessions"), budget.cache("ledgers")
    sessions.put("s1", "S1", 40)
    ledgers.put("l1", "L1", 40)
    assert sessions.get("s1") == "S1"  # used: now the newest
    ledgers.put("l2", "L2", 40)  # 120 > 100: the oldest goes, l1, not s1
    assert ("l1" in ledgers, "s1" in sessions, "l2" in ledgers) == (False, True, True)
    assert budget.used == 80 * DECODED_PER_ENCODED
    sessions.put("s1", "S1'", 10)  # a put again weighs what it weighs now
    assert budget.used == 50 * DECODED_PER_ENCODED
    ledgers.put("l2", "L2'")  # no size given: as before
    assert budget.used == 50 * DECODED_PER_ENCODED
    sessions.clear()
    assert budget.used == 40 * DECODED_PER_ENCODED and len(sessions) == 0


def test_a_cache_keeps_its_own_count_cap_and_one_entry_always_fits() -> None:
    budget = Budget(10**9)
    c = budget.cache("ledgers", max_entries=2)
    for key in ("a", "b", "c"):
        c.put(key, key.upper(), 1)
    assert ("a" in c, len(c), budget.used) == (False, 2, 2 * DECODED_PER_ENCODED)
    small = Budget(1)
    d = small.cache("x")
    d.put("huge", "H", 10**6)  # larger than the budget: kept alone (the batch just wrote it)
    assert d.get("huge") == "H"
    d.put("next", "N", 10**6)
    assert ("huge" in d, "next" in d) == (False, True)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("ab"), st.sampled_from("pqrs"),
                          st.one_of(st.none(), st.integers(1, 50))), max_size=60))  # fmt: skip
def test_the_budget_holds_and_its_books_balance(ops: list) -> None:
    budget = Budget(80 * DECODED_PER_ENCODED)
    caches = {"a": budget.cache("a"), "b": budget.cache("b", max_entries=2)}
    for name, key, size in ops:
        caches[name].put(key, key, size)
        weights = [w for c in caches.values() for w in c._weights.values()]
        assert budget.used == sum(weights)
        assert budget.used <= budget.max_bytes or sum(len(c) for c in caches.values()) == 1
        assert len(caches["b"]) <= 2


def test_every_stage_of_a_worker_shares_one_budget() -> None:
    from memdiag.streams.stages.observations import ObservationStage
    from memdiag.streams.stages.sessions import SessionStage

    s = Settings(decoded_cache_mb=3)
    sessions = SessionStage(s, lambda sid: 0)
    observations = ObservationStage(s)
    budget = shared_budget(3 << 20)
    assert sessions.states._cache.budget is budget is observations._cache.budget
    assert observations._strengths.budget is budget


def test_raw_bytes_weigh_once() -> None:
    """A session's vectors (bytes held decoded as they are stored) weigh their bytes, not
    DECODED_PER_ENCODED times them: under MEMDIAG_DETECTOR=semantic a session's cache entry
    was five times too heavy, and the sessions of a busy worker no longer fit."""
    budget = Budget(10_000 * DECODED_PER_ENCODED)
    cache = budget.cache("sessions")
    cache.put("s", "S", 1_000, raw_bytes=600)
    assert budget.used == 400 * DECODED_PER_ENCODED + 600
    cache.put("s", "S", 100, raw_bytes=600)  # never more raw than encoded
    assert budget.used == 1 * DECODED_PER_ENCODED + 100
