"""The trace stage: span records in, keyed by trace id; what they say of sessions out.

No Faust, no Kafka. The span stage (``memdiag.streams.stages.spans``) sends each span's record here,
to the partition of ``otlp-traces`` its trace id gives (co-partitioned with ``events``: the
traces live in the worker's one state table, keys ``t:`` and ``tc:``). A trace's spans come in
any order, over many messages, from many records; this stage keeps each trace's links
(span, parent) and sends, for each span, what it says once its context is known:

- **Session and agent** (docs/spans.md). A span's session is its own
  ``gen_ai.conversation.id`` (else ``session.id``), else its resource's, else that of its
  nearest ancestor that has one; its agent its own ``gen_ai.agent.id`` (else
  ``gen_ai.agent.name``), else its resource's, else the first found on the way up to the
  ancestor that gave the session. A span whose session needs an ancestor waits until every
  span between it and that ancestor has come, in this service or another (a remote parent
  is looked up like any other); one whose ancestors end at the trace's root without a
  session is dead-lettered. So what a span says depends on its trace's spans, never on
  their order. A memory write needs its agent the same way.
- **Searches** go to the session (``span-events``, on the partition its id gives) as
  ``search`` events (``event_id`` ``trace:span:search``,
  ``ts`` its start), and their results with content as a *span retrieval*; **turns** (chat
  and LLM spans) as *span turns*. The session stage builds each turn's injection from the
  retrievals since the conversation's previous turn (``memdiag.streams.session.session``).
- **Outcomes**: an ``invoke_agent`` span with ``memdiag.outcome`` is a ``session_outcome``
  (``ts`` its end); its tool calls are its ``execute_tool`` descendants (success from the
  span status, ``memdiag.file``), their exceptions its errors, its files the files of the
  successful ones when any tool names one. A tool (or a link to one) that comes later
  amends it: the outcome is sent again with a higher ``revision``, which the session stage
  puts in place of the one before.
- **Memory writes** (``create_memory``, ``upsert_memory``) go to ``memory`` as
  ``memory_written`` events (section 9 of the contract), keyed by their agent.

A span seen before (the Collector's retry) changes nothing. State: the trace's log of span
records (their keywords, never texts) in sealed chunks of at most :data:`CHUNK` records and
about :data:`CHUNK_BYTES` (``tc:``: a chunk or a head stays far under a Kafka message's
limit, whatever the spans; a write rewrites the tail and any chunk whose spans were settled)
and its head (``t:``: the log's tail, the outcomes sent). A trace is forgotten after
``MEMDIAG_SESSION_KEEP_HOURS`` of processing time without a span, by a sweep right after
the record that makes one due (``memdiag.streams.clocks``): what still waits is then
dead-lettered, in the same checkpoint that deletes it.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

import orjson

from memdiag.contract import MISSING_FIELD
from memdiag.contract.envelope import InMessage, Output, StateStore
from memdiag.schemas import MEMORY_KINDS, SESSION_KINDS
from memdiag.schemas.deadletters import add_dead_letter
from memdiag.schemas.decode import Decoder, Rejected
from memdiag.schemas.models import format_ts
from memdiag.settings import Settings
from memdiag.streams.clocks import Clocks, Expiry, expiry_index
from memdiag.streams.rules.spans import SEARCH, TURN, WRITE
from memdiag.streams.stages.spans import parts
from memdiag.streams.trace import HEAD, Trace, Wait, chunk_key

#: A span record's keys a dead letter leaves out: where it was read (said apart), whether it
#: was sent, and its vectors (base64 noise that would crowd out the rest).
_NOT_IN_PAYLOAD = frozenset({"o", "d", "g", "dv", "wv"})


class TraceStage:
    """The trace stage's logic; one per worker process."""

    #: Most decoded traces kept in memory, and their bytes (the store holds them all).
    CACHE_SIZE = 10_000
    CACHE_BYTES = 256 * 1024 * 1024

    def __init__(
        self,
        settings: Settings,
        partition_of: Callable[[str], int],
        wall_ms: Callable[[], int] | None = None,
    ):
        self.settings = settings
        self._partition_of = partition_of
        self._wall_ms = wall_ms or (lambda: time.time_ns() // 1_000_000)
        self._keep_ms = settings.keep_ms
        self._sessions = Decoder(SESSION_KINDS, settings.topics.events, 1 << 62)
        self._memory = Decoder(MEMORY_KINDS, settings.topics.memory, 1 << 62)
        self.clocks = Clocks(min(60_000, max(1, self._keep_ms // 4)), name="traces")
        self._cache: dict[str, tuple[Trace, int]] = {}  # (trace, its bytes)
        self._cached_bytes = 0

    held_bytes = 0

    def settle(self, store: StateStore) -> None:
        """Nothing held: every batch writes what it changed."""

    def reset(self) -> None:
        self.clocks.clear()
        self._forget_decoded()

    def _forget_decoded(self) -> None:
        self._cache.clear()
        self._cached_bytes = 0

    def process(self, msgs: list[InMessage], store: StateStore) -> Output:
        try:
            return self._process(msgs, store)
        except BaseException:
            # a trace may have changed and not been written; the expiry index has the times
            # of traces this batch touched: both go, rebuilt from the store
            self.reset()
            raise

    def _process(self, msgs: list[InMessage], store: StateStore) -> Output:
        out = Output()
        wall = self._wall_ms()
        touched: dict[str, Trace] = {}
        sessions: dict[str, list[dict[str, Any]]] = {}
        ended: set[int] = set()
        for msg in msgs:
            now = self.clocks.advance(msg.partition, msg.timestamp_ms, wall, store)
            if msg.timestamp_ms is not None:
                out.timestamp_ms = max(out.timestamp_ms or 0, msg.timestamp_ms)
            by_trace: dict[str, list[dict[str, Any]]] = {}
            for rec in orjson.loads(msg.value or b"[]"):
                if rec.get("end"):  # memdiag run: the input is all in
                    ended.add(msg.partition)
                    continue
                by_trace.setdefault(rec["t"], []).append(rec)
            expiry = self._expiry(msg.partition, store)
            for trace_id, records in by_trace.items():
                trace = touched.get(trace_id) or self._load(trace_id, msg.partition, store)
                touched[trace_id] = trace
                trace.last_seen_ms = max(trace.last_seen_ms, now)
                if trace_id not in expiry.index:  # new: due a keep time from now at the soonest
                    expiry.set(trace_id, now)
                self._apply(trace, records, out, sessions)
            # right after the record whose time makes it due, as if each record were a batch
            # of its own: where a batch ends decides nothing
            self._sweep(msg.partition, store, out, touched)
        for partition in sorted(ended):
            self.end_of_input(partition, store, touched, out)
        for trace in touched.values():
            self._write(trace, store)
        self.clocks.save(store)
        partitions: dict[int, list[dict[str, Any]]] = {}
        for session_id, records in sessions.items():
            partitions.setdefault(self._partition_of(session_id), []).extend(records)
        for partition, records in partitions.items():
            out.span_events.extend((partition, part) for part in parts(records))
        return out

    # -- one trace ----------------------------------------------------------------------------

    def _apply(
        self,
        trace: Trace,
        records: list[dict[str, Any]],
        out: Output,
        sessions: dict[str, list[dict[str, Any]]],
    ) -> None:
        fresh = [rec["s"] for rec in records if trace.add(rec)]  # a span seen before: nothing
        # what the new spans decide: themselves, and the spans that waited for them; in the
        # order they started (the turns of a session come to it in order: no rebuild there)
        todo = {s for s in fresh if s in trace.waiting}
        todo |= {w for s in fresh for w in trace.blocked.pop(s, ())}
        for span_id in sorted(todo, key=lambda s: (trace.index[s]["b"], s)):
            if span_id in trace.waiting:
                self._try(trace, trace.index[span_id], out, sessions)
        if fresh:  # a tool, or a link to one, may amend an outcome sent before
            for agent in trace.agents:
                if agent["s"] in trace.sent and agent["s"] not in trace.waiting:
                    self._outcome(trace, agent, out, sessions, again=False)

    @staticmethod
    def _context(trace: Trace, rec: dict[str, Any]) -> Any:
        return trace.agent_of(rec) if rec["role"] == WRITE else trace.session_of(rec)

    def _try(
        self,
        trace: Trace,
        rec: dict[str, Any],
        out: Output,
        sessions: dict[str, list[dict[str, Any]]],
    ) -> None:
        """Send what a waiting span says if its context is known now (else note what it
        waits for)."""
        found = self._context(trace, rec)
        if isinstance(found, Wait):
            trace.blocked.setdefault(found.span_id, set()).add(rec["s"])
            return
        trace.settle(rec["s"], "d")
        self._send(trace, rec, found, out, sessions)

    def _send(
        self,
        trace: Trace,
        rec: dict[str, Any],
        found: Any,
        out: Output,
        sessions: dict[str, list[dict[str, Any]]],
    ) -> None:
        role = rec["role"]
        if role == WRITE:
            self._write_memory(rec, found, out)
            return
        session, agent = found
        if session is None:
            self._reject(rec, out, "no gen_ai.conversation.id or session.id on the span, its "
                         "resource or its ancestors: name the conversation on the agent's "
                         "spans (or its resource) so memdiag knows the session")  # fmt: skip
            return
        scope = {"session_id": session}
        for key, value in (("agent_id", agent), ("org_id", rec.get("org")),
                           ("project_id", rec.get("proj"))):  # fmt: skip
            if value is not None:
                scope[key] = value
        key = f"{trace.trace_id}:{rec['s']}"
        if role == SEARCH:
            search = {"kind": "search", "event_id": f"{key}:search", "ts": format_ts(rec["b"]),
                      **scope, "query": rec.get("q", ""), "result_ids": rec.get("ids", []),
                      "source": rec.get("src", "agent")}  # fmt: skip
            # a human's search is not in the agent's context: it injects nothing
            docs = rec.get("docs") if search["source"] == "agent" else None
            # as an injection of them would be checked (an id too long, say): refused whole
            check = {"kind": "injection", "event_id": f"{key}:injection", "ts": search["ts"],
                     **scope, "turn_id": key,
                     "observations": [{"id": i, "content": ""} for i, _ in docs or ()]}  # fmt: skip
            if self._valid(self._sessions, search, rec, out) and self._valid(
                self._sessions, check, rec, out
            ):
                records = [search]
                if docs:
                    retrieval = {"kind": "span_retrieval", "id": key, "ts": rec["b"],
                                 "observations": docs, **scope}  # fmt: skip
                    if "dv" in rec:  # MEMDIAG_DETECTOR=semantic: each document's vectors
                        retrieval["vectors"] = rec["dv"]
                    records.append(retrieval)
                sessions.setdefault(session, []).extend(records)
        elif role == TURN:
            turn: dict[str, Any] = {"kind": "span_turn", "id": key, "ts": rec["b"],
                                    "end": rec["e"], **scope}  # fmt: skip
            if "words" in rec:
                turn["words"] = rec["words"]
                if "wv" in rec:  # MEMDIAG_DETECTOR=semantic: the output text's vectors
                    turn["vectors"] = rec["wv"]
            else:
                turn["unjudged"] = rec.get("why")
            check = {"kind": "response", "event_id": f"{key}:response",
                     "ts": format_ts(rec["e"]), **scope, "turn_id": key, "text": ""}  # fmt: skip
            if self._valid(self._sessions, check, rec, out):
                sessions.setdefault(session, []).append(turn)
        else:  # an outcome
            trace.sent.setdefault(rec["s"], [0, None])
            self._outcome(trace, rec, out, sessions, again=True, found=found)

    def _outcome(
        self,
        trace: Trace,
        agent: dict[str, Any],
        out: Output,
        sessions: dict[str, list[dict[str, Any]]],
        again: bool,
        found: Any = None,
    ) -> None:
        """Send the outcome of ``agent``'s span if it changed (or ``again``), amended: a
        higher revision."""
        if found is None:
            found = trace.session_of(agent)
            if isinstance(found, Wait) or found[0] is None:
                return
        session, agent_id = found
        body = trace.outcome_body(agent)
        digest = hashlib.blake2b(orjson.dumps(body), digest_size=12).hexdigest()
        sent = trace.sent[agent["s"]]
        if sent[1] != digest:
            sent[0], sent[1] = sent[0] + 1, digest
        elif not again:
            return
        event: dict[str, Any] = {
            "kind": "session_outcome",
            "event_id": f"{trace.trace_id}:{agent['s']}:session_outcome",
            "ts": format_ts(agent["e"]),
            "session_id": session,
            "outcome": agent["outcome"],
            **body,
            "revision": sent[0],
        }
        for key, value in (("agent_id", agent_id), ("org_id", agent.get("org")),
                           ("project_id", agent.get("proj"))):  # fmt: skip
            if value is not None:
                event[key] = value
        # A published outcome must have files_modified; one from spans that name no file
        # cannot know them and goes without (contract section 3): checked with a stand-in
        check = event if "files_modified" in event else {**event, "files_modified": []}
        if self._valid(self._sessions, check, agent, out):
            sessions.setdefault(session, []).append(event)

    def _write_memory(self, rec: dict[str, Any], agent: str | None, out: Output) -> None:
        if agent is None:
            self._reject(rec, out, "a memory write whose agent is unknown: no "
                         "gen_ai.agent.id or gen_ai.agent.name on the span, its resource or "
                         "its ancestors")  # fmt: skip
            return
        key = f"{rec['t']}:{rec['s']}:memory_written"
        mids = rec["mids"]
        events = []
        for n, mid in enumerate(mids):
            e = {"kind": "memory_written", "event_id": key if len(mids) == 1 else f"{key}:{n}",
                 "ts": format_ts(rec["e"]), "agent_id": agent, "memory_id": mid}  # fmt: skip
            if "store" in rec:
                e["store"] = rec["store"]
            if self._valid(self._memory, e, rec, out):
                events.append(e)
        if events:
            out.reroute_memory.append((agent, events, rec["o"][4]))

    def _valid(self, decoder: Decoder, event: dict[str, Any], rec: dict[str, Any],
               out: Output) -> bool:  # fmt: skip
        problem = decoder.check(event)
        if problem is None:
            return True
        self._reject(rec, out, f"its {event['kind']} event is refused: {problem[1]}", problem[0])
        return False

    def _reject(
        self, rec: dict[str, Any], out: Output, detail: str, reason: str = MISSING_FIELD
    ) -> None:
        topic, partition, offset, index, timestamp_ms = rec["o"]
        origin = InMessage(topic, partition, offset, None, None, timestamp_ms)
        payload = orjson.dumps(
            {k: v for k, v in rec.items() if k not in ("o", "d", "g", "dv", "wv")}
        )
        add_dead_letter(out, origin, Rejected(index, reason, detail, payload), self.settings)

    # -- the store ----------------------------------------------------------------------------

    def _load(self, trace_id: str, partition: int, store: StateStore) -> Trace:
        cached = self._cache.get(trace_id)
        if cached is not None:
            return cached[0]
        raw = store.get(HEAD + trace_id, partition)
        if raw is None:
            return Trace(trace_id, partition)
        trace = Trace.restore(trace_id, orjson.loads(raw), store)
        for span_id in trace.waiting:  # what each waits for (nothing to send: known)
            found = self._context(trace, trace.index[span_id])
            if isinstance(found, Wait):
                trace.blocked.setdefault(found.span_id, set()).add(span_id)
        return trace

    def _write(self, trace: Trace, store: StateStore) -> None:
        p = trace.partition
        for index in sorted(trace.rewrite):
            store.put(chunk_key(trace.trace_id, index), orjson.dumps(trace.chunk(index)), p)
        trace.rewrite.clear()
        while (sealed := trace.seal()) is not None:
            index, chunk = sealed
            store.put(chunk_key(trace.trace_id, index), orjson.dumps(chunk), p)
        store.put(HEAD + trace.trace_id, orjson.dumps(trace.header()), p)
        self._uncache(trace.trace_id)
        while self._cache and (len(self._cache) >= self.CACHE_SIZE
                               or self._cached_bytes + trace.bytes > self.CACHE_BYTES):  # fmt: skip
            self._cached_bytes -= self._cache.pop(next(iter(self._cache)))[1]  # the oldest
        self._cache[trace.trace_id] = (trace, trace.bytes)
        self._cached_bytes += trace.bytes
        self._expiry(p, store).set(trace.trace_id, trace.last_seen_ms)

    def _expiry(self, partition: int, store: StateStore) -> Expiry:
        expiry = self.clocks.expiry.get(partition)
        if expiry is None:
            keep = self._keep_ms
            expiry = self.clocks.expiry[partition] = Expiry(
                expiry_index(store, partition, HEAD), lambda _, at_ms: at_ms + keep
            )
        return expiry

    def _sweep(
        self,
        partition: int,
        store: StateStore,
        out: Output,
        touched: dict[str, Trace],
    ) -> None:
        """Forget the traces of ``partition`` without a span for MEMDIAG_SESSION_KEEP_HOURS
        of its processing time, if a sweep is due; the spans still waiting in one are
        dead-lettered (given up). Only the traces whose time may have come are looked at
        (:class:`memdiag.streams.clocks.Expiry`); one this batch touched is dropped from
        ``touched`` (never written again), its last-seen time its own."""
        if not self.clocks.due(partition):
            return
        now = self.clocks.now.get(partition, 0)
        why = ("it never arrived within MEMDIAG_SESSION_KEEP_HOURS (is that service's tracing "
               "sent to memdiag's topic?)")  # fmt: skip

        def time_of(trace_id: str, indexed: int) -> int:
            trace = touched.get(trace_id)
            return indexed if trace is None else max(indexed, trace.last_seen_ms)

        for trace_id in self._expiry(partition, store).expired(now, time_of):
            trace = touched.pop(trace_id, None)
            if trace is None:
                trace = self._load(trace_id, partition, store)
            self._uncache(trace_id)
            if trace.chunks == 0 and not trace.log:
                continue  # not in the store (any more)
            self._give_up(trace, out, why)
            store.delete(HEAD + trace_id, partition)
            for i in range(trace.chunks):
                store.delete(chunk_key(trace_id, i), partition)

    def _give_up(self, trace: Trace, out: Output, why: str) -> None:
        """Dead-letter the spans of ``trace`` still waiting for an ancestor: they are given
        up (never sent, even if their ancestor comes after all)."""
        for span_id in sorted(trace.waiting):
            rec = trace.index[span_id]
            found = self._context(trace, rec)
            missing = found.span_id if isinstance(found, Wait) else None
            trace.settle(span_id, "g")
            self._reject(
                rec,
                out,
                "its context never came: no gen_ai.conversation.id or "
                "session.id (for a memory write: no agent) on the span or its "
                f"resource, and its ancestor span {missing} did not come: {why}",
            )

    def end_of_input(
        self, partition: int, store: StateStore, touched: dict[str, Trace], out: Output
    ) -> None:
        """``memdiag run``'s input is all in: what still waits in the partition's traces
        never will (dead-lettered now, not a day later)."""
        traces = set(self._expiry(partition, store).index) | {
            t for t, trace in touched.items() if trace.partition == partition
        }
        for trace_id in sorted(traces):
            trace = touched.get(trace_id) or self._load(trace_id, partition, store)
            if trace.waiting:
                touched[trace_id] = trace
                self._give_up(trace, out, "the input ended")

    def _uncache(self, trace_id: str) -> None:
        known = self._cache.pop(trace_id, None)
        if known is not None:
            self._cached_bytes -= known[1]
