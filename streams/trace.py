"""One trace's spans as far as they have come, and what was sent of them: the trace stage's
state (``memdiag.streams.stages.traces``). Pure code: no Faust, no Kafka.

A trace's log of span records (their keywords, never texts) is kept in sealed chunks of at
most :data:`CHUNK` records and about :data:`CHUNK_BYTES` (``tc:``: a chunk or a head stays far
under a Kafka message's limit, whatever the spans; a write rewrites the tail and any chunk
whose spans were settled) and its head (``t:``: the log's tail, the outcomes sent).
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

import orjson

from memdiag.contract.envelope import StateStore
from memdiag.streams.rules.spans import AGENT, SEARCH, TOOL, TURN, WRITE

HEAD, CHUNK_PREFIX = "t:", "tc:"

#: Span records per sealed chunk of a trace's log, and bytes (a chunk holds at least one).
CHUNK = 16
CHUNK_BYTES = 256 * 1024


def chunk_key(trace_id: str, index: int) -> str:
    return f"{CHUNK_PREFIX}{trace_id}\0{index}"


class Wait:
    """A walk up the trace that stops at a span not come yet."""

    __slots__ = ("span_id",)

    def __init__(self, span_id: str):
        self.span_id = span_id


Found = tuple[str | None, str | None]  # (session, agent); session None: there is none


class Trace:
    """One trace's spans as far as they have come, and what was sent of them."""

    def __init__(self, trace_id: str, partition: int):
        self.trace_id = trace_id
        self.partition = partition
        self.log: list[dict[str, Any]] = []  # span records, in arrival order
        self.sealed = 0  # log[:sealed] are in sealed chunks
        self.starts: list[int] = []  # where each sealed chunk starts in the log
        self.rewrite: set[int] = set()  # sealed chunks to write again (a span settled)
        self.sizes: list[int] = []  # each record's bytes, as JSON
        self.bytes = 0  # all of them
        self.index: dict[str, dict[str, Any]] = {}
        self.position: dict[str, int] = {}  # span id -> where its record is in the log
        self.tools: list[dict[str, Any]] = []
        self.agents: list[dict[str, Any]] = []  # those with an outcome
        self.waiting: set[str] = set()  # spans whose context has not come yet
        self.given_up: set[str] = set()  # spans dead-lettered waiting (never sent then)
        self.blocked: dict[str, set[str]] = {}  # missing span id -> waiting span ids
        self.sent: dict[str, list[Any]] = {}  # outcome span -> [revision, digest]
        self.last_seen_ms = 0

    # -- the index ----------------------------------------------------------------------------

    def _index(self, rec: dict[str, Any], position: int) -> None:
        self.index[rec["s"]] = rec
        self.position[rec["s"]] = position
        role = rec.get("role")
        if role == TOOL:
            self.tools.append(rec)
        elif role == AGENT and "outcome" in rec:
            self.agents.append(rec)

    def add(self, rec: dict[str, Any]) -> bool:
        """Add a span's record (waiting, if it says something); False if the span was seen
        before."""
        if rec["s"] in self.index:
            return False
        self._index(rec, len(self.log))
        self.log.append(rec)
        self._sized(rec)
        if says(rec):
            self.waiting.add(rec["s"])
        return True

    def settle(self, span_id: str, how: str) -> None:
        """A waiting span is sent (``d``) or given up (``g``): said in its record (a sealed
        chunk holding it is written again)."""
        self.waiting.discard(span_id)
        if how == "g":
            self.given_up.add(span_id)
        rec = self.index[span_id]
        rec[how] = 1
        position = self.position[span_id]
        if position < self.sealed:
            self.rewrite.add(bisect_right(self.starts, position) - 1)

    def _sized(self, rec: dict[str, Any]) -> None:
        size = len(orjson.dumps(rec))
        self.sizes.append(size)
        self.bytes += size

    # -- walks up the trace -----------------------------------------------------------------

    def session_of(self, rec: dict[str, Any]) -> Found | Wait:
        agent = rec.get("ag") or rec.get("rag")
        if "sid" in rec:
            return rec["sid"], agent
        if "rsid" in rec:
            return rec["rsid"], agent
        seen = {rec["s"]}
        cur = rec
        while True:
            pid = cur.get("p")
            if pid is None:
                return None, None  # the trace's root: no session
            parent = self.index.get(pid)
            if parent is None:
                return Wait(pid)
            if pid in seen:
                return None, None  # a cycle (broken ids): no session
            seen.add(pid)
            if agent is None:
                agent = parent.get("ag")
            if "sid" in parent:
                return parent["sid"], agent
            cur = parent

    def agent_of(self, rec: dict[str, Any]) -> str | None | Wait:
        agent: str | None = rec.get("ag") or rec.get("rag")
        seen = {rec["s"]}
        cur = rec
        while agent is None:
            pid = cur.get("p")
            if pid is None:
                return None
            parent = self.index.get(pid)
            if parent is None:
                return Wait(pid)
            if pid in seen:
                return None
            seen.add(pid)
            agent, cur = parent.get("ag"), parent
        return agent

    def under(self, rec: dict[str, Any], ancestor: str) -> bool:
        """Whether ``ancestor`` is an ancestor of ``rec`` as far as the trace has come."""
        seen = {rec["s"]}
        cur = rec
        while True:
            pid = cur.get("p")
            if pid is None or pid in seen:
                return False
            if pid == ancestor:
                return True
            parent = self.index.get(pid)
            if parent is None:
                return False
            seen.add(pid)
            cur = parent

    # -- outcomes -----------------------------------------------------------------------------

    def outcome_body(self, agent_span: dict[str, Any]) -> dict[str, Any]:
        """An outcome's tool calls, files and errors, from the tools under its span."""
        tools = sorted(
            (t for t in self.tools if self.under(t, agent_span["s"])),
            key=lambda t: (t["b"], t["s"]),
        )
        calls = []
        errors = []
        for t in tools:
            call: dict[str, Any] = {"tool": t["tool"], "success": t["ok"]}
            if "file" in t:
                call["file"] = t["file"]
            calls.append(call)
            errors += [{"message": m, "tool": t["tool"], "recoverable": bool(t.get("rec"))}
                       for m in t.get("err", ())]  # fmt: skip
        body: dict[str, Any] = {"tool_calls": calls, "errors": errors}
        if any("file" in t for t in tools):
            body["files_modified"] = list(dict.fromkeys(t["file"] for t in tools
                                                        if t["ok"] and "file" in t))  # fmt: skip
        return body

    # -- persistence --------------------------------------------------------------------------

    @property
    def chunks(self) -> int:
        return len(self.starts)

    def header(self) -> dict[str, Any]:
        head: dict[str, Any] = {
            "p": self.partition,
            "l": self.last_seen_ms,
            "n": self.chunks,
            "t": self.log[self.sealed :],
        }
        if self.sent:
            head["o"] = self.sent
        return head

    def chunk(self, index: int) -> list[dict[str, Any]]:
        end = self.starts[index + 1] if index + 1 < len(self.starts) else self.sealed
        return self.log[self.starts[index] : end]

    def seal(self) -> tuple[int, list[dict[str, Any]]] | None:
        """The next chunk of the log's tail to write under its own key, if the tail is full
        (:data:`CHUNK` records, or :data:`CHUNK_BYTES`)."""
        end, size = self.sealed, 0
        while end < len(self.log) and end - self.sealed < CHUNK:
            if end > self.sealed and size + self.sizes[end] > CHUNK_BYTES:
                break  # the next one would cross it: it starts the next chunk
            size += self.sizes[end]
            end += 1
        if end == len(self.log) and end - self.sealed < CHUNK and size <= CHUNK_BYTES:
            return None  # the tail is not full
        chunk = self.log[self.sealed : end]
        index = len(self.starts)
        self.starts.append(self.sealed)
        self.sealed = end
        return index, chunk

    @classmethod
    def restore(cls, trace_id: str, head: dict[str, Any], store: StateStore) -> Trace:
        trace = cls(trace_id, head["p"])
        trace.last_seen_ms = head["l"]
        for i in range(head["n"]):
            raw = store.get(chunk_key(trace_id, i), trace.partition)
            if raw is None:
                raise RuntimeError(f"trace {trace_id}: log chunk {i} is missing")
            trace.starts.append(len(trace.log))
            trace.log.extend(orjson.loads(raw))
        trace.sealed = len(trace.log)
        trace.log.extend(head["t"])
        for position, rec in enumerate(trace.log):
            trace._sized(rec)
            trace._index(rec, position)
            if "g" in rec:
                trace.given_up.add(rec["s"])
            elif "d" not in rec and says(rec):
                trace.waiting.add(rec["s"])
        trace.sent = head.get("o", {})
        return trace


def says(rec: dict[str, Any]) -> bool:
    """Whether the span says something of its session or agent (once its context is known)."""
    return rec.get("role") in (SEARCH, TURN, WRITE) or "outcome" in rec
