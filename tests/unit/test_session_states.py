"""``SessionStates``: a session written is the one loaded back while its bytes are current;
new bytes (a rebalance, a recovery, another writer) rebuild it; forgetting an idle session
leaves a tombstone that stops it from starting again, and the tombstone goes in its turn."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from memdiag.contract.envelope import DictStore, Output
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


#: steps of the processing clock: around the keep time, where forgetting is decided
TICKS = st.one_of(
    st.sampled_from([KEEP_MS // 2, KEEP_MS - 1, KEEP_MS, KEEP_MS + 1]), st.integers(0, 3 * KEEP_MS)
)


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["touch", "hold", "write", "tick", "sweep", "restart"]),
                  st.integers(0, 4), TICKS),
        max_size=60,
    )  # fmt: skip
)
def test_the_sweep_forgets_what_a_look_at_every_key_would(
    steps: list[tuple[str, int, int]],
) -> None:
    """The sweep looks only at the entries whose time has come (a heap, soonest first), and
    forgets what a look at every session and tombstone of the partition would: sessions
    seen since their entry was pushed, held unwritten, new and never written, written again
    after a restart. The reference is the rule itself over every key."""
    states, store = SessionStates(CONFIG, KEEP_MS), DictStore()
    now = 10 * KEEP_MS
    held: dict[str, Session] = {}
    seen: dict[str, int] = {}  # the reference: every live session's last-seen time
    laid: dict[str, int] = {}  # and every tombstone's
    states.clocks.advance(0, now, wall_ms=10**13)
    for op, who, amount in steps:
        sid = f"s{who}"
        if op in ("touch", "hold"):  # an event: the session held, and written unless "hold"
            session = held.get(sid) or states.load(sid, 0, store)
            if session is None:
                assert sid in laid  # only a tombstone keeps a session from starting
                continue
            session.last_seen_ms = now
            seen[sid] = now
            held[sid] = session
            if op == "touch":
                states.write(held.pop(sid), store)
        elif op == "write":
            for session in held.values():
                states.write(session, store)
            held.clear()
        elif op == "tick":
            now += amount
            states.clocks.advance(0, now, wall_ms=10**13)
        elif op == "restart":  # a rollback: what was held is gone with the checkpoint
            for sid in held:
                if HEAD + sid not in store.data:
                    seen.pop(sid)  # never written: as if it never came
                else:
                    seen[sid] = orjson.loads(store.data[HEAD + sid])["l"]
            held.clear()
            states.clear()
            states.clocks.advance(0, now, wall_ms=10**13)
        else:
            states.sweep(0, store, Output(), held)
            for sid, at in list(seen.items()):
                if at < now - KEEP_MS:
                    del seen[sid]
                    held.pop(sid, None)
                    laid[sid] = now
            for sid, at in list(laid.items()):
                if at < now - KEEP_MS * TOMBSTONE_FACTOR:
                    del laid[sid]
            stones = {k[len(TOMBSTONE) :] for k in store.data if k.startswith(TOMBSTONE)}
            assert stones == set(laid)
            live = {k[len(HEAD) :] for k in store.data if k.startswith(HEAD)} | set(held)
            assert live == set(seen)


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
