"""``SessionStates``: a session written is the one loaded back while its bytes are current;
new bytes (a rebalance, a recovery, another writer) rebuild it; forgetting an idle session
leaves a tombstone that stops it from starting again, and the tombstone goes in its turn."""

from __future__ import annotations

from memdiag.contract.envelope import DictStore, Output
from memdiag.streams.session.session import Config, Session
from memdiag.streams.session.states import HEAD, TOMBSTONE, TOMBSTONE_FACTOR, SessionStates

CONFIG = Config(window_us=30_000_000, retention_us=86_400_000_000, turn_ttl_us=3_600_000_000)
KEEP_MS = 3_600_000


def test_the_written_session_is_the_one_loaded_until_the_stage_is_reset() -> None:
    states, store = SessionStates(CONFIG, KEEP_MS), DictStore()
    assert states.load("s", 0, store, create=False) is None
    session = states.load("s", 0, store)
    assert isinstance(session, Session)
    states.write(session, store)
    assert states.load("s", 0, store) is session  # the cached one: no decoding
    states.clear()  # the runner rolled the state back, or partitions moved
    again = states.load("s", 0, store)
    assert (
        again is not session
        and again is not None
        and again.records == session.records
        and again.scopes == session.scopes
    )


def test_forgetting_decoded_sessions_rebuilds_them_from_the_store() -> None:
    states, store = SessionStates(CONFIG, KEEP_MS), DictStore()
    session = states.load("s", 0, store)
    assert session is not None
    states.write(session, store)
    states.forget_decoded()
    assert states.load("s", 0, store) is not session


def test_an_idle_session_is_forgotten_and_its_tombstone_expires_later() -> None:
    states, store = SessionStates(CONFIG, KEEP_MS), DictStore()
    states.clocks.advance(0, 1_000, wall_ms=10**13)
    session = states.load("s", 0, store)
    assert session is not None
    session.last_seen_ms = 1_000
    states.write(session, store)
    states.clocks.advance(0, 1_000 + KEEP_MS + 1, wall_ms=10**13)
    states.sweep(0, store, Output())
    assert HEAD + "s" not in store.data and TOMBSTONE + "s" in store.data
    assert states.load("s", 0, store) is None  # a late event cannot start it again
    later = 1_000 + KEEP_MS * (TOMBSTONE_FACTOR + 2)
    states.clocks.advance(0, later, wall_ms=10**13)
    states.sweep(0, store, Output())
    assert TOMBSTONE + "s" not in store.data
