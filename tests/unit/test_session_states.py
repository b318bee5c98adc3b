"""``SessionStates``: a session written is the one loaded back while its bytes are current;
new bytes (a rebalance, a recovery, another writer) rebuild it; forgetting an idle session
leaves a tombstone that stops it from starting again, and the tombstone goes in its turn."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from memdiag.contract.envelope import DictStore, Output
from memdiag.streams.clocks import Expiry
from memdiag.streams.session.session import Config, Session
from memdiag.streams.session.states import HEAD, TOMBSTONE, TOMBSTONE_FACTOR, SessionStates
from tests.sizes import examples

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


def test_a_session_last_seen_exactly_the_keep_time_ago_is_kept() -> None:
    """docs/rules.md: forgotten when last seen *more* than the keep time before the clock;
    a tombstone likewise, more than its keep time after it was laid."""
    states, store = SessionStates(CONFIG, KEEP_MS), DictStore()
    states.clocks.advance(0, 1_000, wall_ms=10**13)
    session = states.load("s", 0, store)
    assert session is not None
    session.last_seen_ms = 1_000
    states.write(session, store)
    states.clocks.advance(0, 1_000 + KEEP_MS, wall_ms=10**13)
    states.sweep(0, store, Output())
    assert HEAD + "s" in store.data  # exactly the keep time: kept
    states.clocks.advance(0, 1_000 + KEEP_MS + 1, wall_ms=10**13)
    states.sweep(0, store, Output())
    assert HEAD + "s" not in store.data and TOMBSTONE + "s" in store.data
    laid = 1_000 + KEEP_MS + 1
    states.clocks.advance(0, laid + KEEP_MS * TOMBSTONE_FACTOR, wall_ms=10**13)
    states.sweep(0, store, Output())
    assert TOMBSTONE + "s" in store.data  # exactly its keep time: kept
    states.clocks.advance(0, laid + KEEP_MS * TOMBSTONE_FACTOR + 1, wall_ms=10**13)
    states.sweep(0, store, Output())
    assert TOMBSTONE + "s" not in store.data


def test_the_expiry_heap_gives_a_key_only_past_its_time() -> None:
    expiry = Expiry({"a": 0, "b": 50}, lambda key, at: at + 100)
    assert list(expiry.expired(100, lambda key, at: at)) == []  # a at its edge: not yet
    assert list(expiry.expired(101, lambda key, at: at)) == ["a"]
    # b seen since (its own time 80): due again at 180, not given at 151
    assert list(expiry.expired(151, lambda key, at: 80 if key == "b" else at)) == []
    assert list(expiry.expired(180, lambda key, at: 80)) == []
    assert list(expiry.expired(181, lambda key, at: 80)) == ["b"]
    assert expiry.index == {} and expiry.entries() == []
    # a key seen since, asked exactly at its new edge with its entry still at the old time
    fresh = Expiry({"b": 50}, lambda key, at: at + 100)
    assert list(fresh.expired(180, lambda key, at: 80)) == []
    assert list(fresh.expired(181, lambda key, at: 80)) == ["b"]


#: steps of the processing clock: around the keep time, where forgetting is decided
TICKS = st.one_of(
    st.sampled_from([KEEP_MS // 2, KEEP_MS - 1, KEEP_MS, KEEP_MS + 1, 7 * KEEP_MS]),
    st.integers(0, 3 * KEEP_MS),
)
OPS = ["touch", "hold", "write", "tick", "sweep", "commit", "rollback", "forget_decoded"]
#: session ids, two partitions: "z:s1" is also what "s1"'s tombstone is called in the store
SIDS = [("s0", 0), ("s1", 1), ("z:s1", 1), ("s2", 0), ("z:s0", 0), ("s3", 1)]


def _heap_holds(states: SessionStates, held: dict[str, Session]) -> None:
    """Every key of the expiry index has one entry in the due heap, never later than when
    the key expires (a held session's time is its own)."""
    for expiry in states.clocks.expiry.values():
        due, index = expiry.entries(), expiry.index
        keys = [k for _, k in due]
        assert len(keys) == len(set(keys)) and set(keys) >= set(index)
        for key, at in index.items():
            session = held.get(key[len(HEAD) :]) if key.startswith(HEAD) else None
            real = session.last_seen_ms if session is not None else at
            assert min(t for t, k in due if k == key) <= states._expires(key, real)
    for sid, session in held.items():
        expiry = states.clocks.expiry.get(session.partition)
        assert expiry is None or HEAD + sid in expiry.index


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, len(SIDS) - 1), TICKS),
                max_size=80), st.integers(1, 3))  # fmt: skip
def test_the_sweep_forgets_what_a_look_at_every_key_would(
    steps: list[tuple[str, int, int]], cache_size: int
) -> None:
    """The sweep looks only at the entries whose time has come (a heap, soonest first), and
    forgets what a look at every session and tombstone would: sessions seen since their
    entry was pushed, held unwritten, new and never written, evicted from a cache of one to
    three, rolled back to the last commit, on two partitions of one store, one of them
    called like another's tombstone. The reference is the rule itself over every key."""
    states, store = SessionStates(CONFIG, KEEP_MS, cache_size=cache_size), DictStore()
    now = {0: 10 * KEEP_MS, 1: 10 * KEEP_MS}
    held: dict[str, Session] = {}
    seen: dict[str, int] = {}  # the reference: every live session's last-seen time
    laid: dict[str, int] = {}  # and every tombstone's
    committed: tuple[dict[str, bytes], dict[str, int], dict[str, int]] = ({}, {}, {})
    for p in now:
        states.clocks.advance(p, now[p], wall_ms=10**13)
    for op, who, amount in steps:
        sid, p = SIDS[who]
        if op in ("touch", "hold"):  # an event: the session held, and written unless "hold"
            session = held.get(sid) or states.load(sid, p, store)
            if session is None:
                assert sid in laid  # only a tombstone keeps a session from starting
                continue
            session.last_seen_ms = max(session.last_seen_ms, now[p])
            seen[sid] = session.last_seen_ms
            held[sid] = session
            if op == "touch":
                states.write(held.pop(sid), store)
        elif op in ("write", "commit", "forget_decoded"):  # a write-back, a settle
            for session in held.values():
                states.write(session, store)
            held.clear()
            if op == "commit":
                committed = (dict(store.data), dict(seen), dict(laid))
            elif op == "forget_decoded":
                states.forget_decoded()
        elif op == "tick":
            now[p] += amount
            states.clocks.advance(p, now[p], wall_ms=10**13)
        elif op == "rollback":  # back to the last commit, as the runner's _drop
            store.data, seen, laid = (dict(c) for c in committed)  # type: ignore[assignment]
            held.clear()
            states.clear()
            for q in now:
                states.clocks.advance(q, now[q], wall_ms=10**13)
        else:
            states.sweep(p, store, Output(), held)
            for s, at in list(seen.items()):
                if dict(SIDS)[s] == p and at < now[p] - KEEP_MS:
                    del seen[s]
                    held.pop(s, None)
                    laid[s] = now[p]
            for s, at in list(laid.items()):
                if dict(SIDS)[s] == p and at < now[p] - KEEP_MS * TOMBSTONE_FACTOR:
                    del laid[s]
            assert {k[len(TOMBSTONE) :] for k in store.data if k.startswith(TOMBSTONE)} == set(laid)
            live = {k[len(HEAD) :] for k in store.data if k.startswith(HEAD)} | set(held)
            assert live == set(seen)
        _heap_holds(states, held)


def test_a_session_called_like_a_tombstone_is_forgotten_as_a_session() -> None:
    """A session_id may start with "z:" (the schema allows any): "z:x" is forgotten after the
    keep time, as every session, leaving its own tombstone; before, the index took it for
    the tombstone of "x", kept it seven times as long and then deleted "x"'s tombstone."""
    states, store = SessionStates(CONFIG, KEEP_MS), DictStore()
    t = 100 * KEEP_MS
    states.clocks.advance(0, t, wall_ms=10**13)
    for sid in ("z:x", "x"):
        session = states.load(sid, 0, store)
        assert session is not None
        session.last_seen_ms = t
        states.write(session, store)
    states.clocks.advance(0, t + 2 * KEEP_MS, wall_ms=10**13)
    states.sweep(0, store, Output())
    assert sorted(store.data) == [TOMBSTONE + "x", TOMBSTONE + "z:x"]
    states.clear()  # the index rebuilt from the store tells the two apart too
    states.clocks.advance(0, t + 2 * KEEP_MS + 8 * KEEP_MS, wall_ms=10**13)
    states.sweep(0, store, Output())
    assert store.data == {}


def test_a_session_held_unwritten_that_expires_is_forgotten_and_not_written() -> None:
    """A catch-up can span the keep time within one checkpoint: a new session, held and never
    written, idle past its keep time at a sweep, is forgotten (a tombstone, nothing else),
    and dropped from what the stage holds."""
    states, store = SessionStates(CONFIG, KEEP_MS), DictStore()
    states.clocks.advance(0, 1_000, wall_ms=10**13)
    session = states.load("s", 0, store)
    assert session is not None
    session.last_seen_ms = 1_000
    held = {"s": session}
    states.clocks.advance(0, 1_000 + KEEP_MS + 1, wall_ms=10**13)
    states.sweep(0, store, Output(), held)
    assert held == {} and sorted(store.data) == [TOMBSTONE + "s"]
