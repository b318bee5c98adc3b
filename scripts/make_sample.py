"""Make the bundled demo sample: realistic agent sessions, deterministically.

    python scripts/make_sample.py memdiag/data/sample.jsonl [--sessions 300] [--seed 20261121]

Same arguments, same bytes (a test checks the bundled file against a fresh run). Each
session searches its memory (refinements within the followup window, retries of the same
query, late searches, searches whose results overlap, viewer searches, empty results), gets
memories injected, answers, and ends accepted, rejected or reworked; some inject a stale
memory that makes them fail, some never search. Two benchmark runs (a baseline and a
candidate with a better reranker) judge the same 150 questions twice each. Four agents'
memory pipelines are shaped like the recall paper's table: one healthy, one whose indexer
was orphaned partway (a migration), one never indexed, and one with repetitive episode names
that its own name's probe finds less as they pile up; a fifth's query embedder was swapped
partway (every memory indexed, no probe finds one after it). Hourly probe sweeps give the
trends. A sixth writes its own clinical rules and probes each twice a sweep: by its name,
which finds it, and by a clinical presentation it should serve, which finds one in five (the
paper's query-formulation failure). The billing agent's knowledge graph holds one stale
edge (svc_billing WRITES_TO ledger_v1) that misleads the sessions it is injected into, and
every deploy turn is injected a changelog memory no answer needs (dead weight). A few
deliberately bad lines show the dead-letter path.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

TOPICS = {
    "auth": ["auth flow", "token refresh", "session cookie signing", "oauth callback url"],
    "billing": ["invoice rounding", "stripe webhook retries", "proration on plan change"],
    "deploy": ["blue green deploy", "rollback procedure", "helm chart values"],
    "db": ["migration locking", "index on orders table", "connection pool size"],
    "search": ["reranker threshold", "embedding model version", "bm25 field weights"],
    "frontend": ["hydration mismatch", "bundle size budget", "dark mode tokens"],
}
WORDS = {
    "auth": "access tokens expire refresh endpoint rotates session cookies signed secret vault "
    "callback redirect scopes consent",
    "billing": "invoices rounding currency webhook retries idempotency proration subscription "
    "customer ledger",
    "deploy": "deployment rollback traffic switch canary helm values replicas readiness probes "
    "cluster",
    "db": "migration locking tables index orders queries connection pooling postgres vacuum "
    "replica",
    "search": "reranker threshold embedding model version recall precision weights fields "
    "tokenizer",
    "frontend": "hydration mismatch server render bundle budget webpack tokens theme styles "
    "components",
}
SYLLABLES = "ka lo mar ven tis rup del quo fen sar bri nox tal gem hul pes".split()
TOOLS_OK = ["edit", "read_file", "bash", "grep"]
TEST_TOOLS = ["vitest", "pytest", "jest", "go test", "cargo-test"]
BASE = datetime(2026, 11, 21, 8, 0, 0, tzinfo=UTC)


def ts(dt: datetime) -> str:
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Sample:
    def __init__(self, seed: int):
        self.r = random.Random(seed)
        self.n = 0
        self.observations: dict[str, list[tuple[str, str]]] = {}
        for topic, words in WORDS.items():
            vocab = words.split()
            obs = []
            for i in range(12):
                # two words of the topic and five of its own (module, flag and ticket
                # names...): memories of one topic overlap a little, as real ones do
                picked = self.r.sample(vocab, 2)
                own = [self.word() for _ in range(5)]
                text = (
                    f"The {picked[0]} in {own[0]} uses {own[1]}; see {own[2]} and set "
                    f"{own[3]} for {picked[1]} ({own[4]})."
                )
                obs.append((f"obs_{topic}_{i:02d}", text))
            self.observations[topic] = obs
        # One stale memory per topic: whenever it is injected, the session fails (it is
        # what memdiag should flag as misleading and downweight).
        self.stale = {
            topic: (
                f"obs_{topic}_stale",
                f"Legacy note: the {topic} code path was replaced; keep patching the old "
                "module directly and skip the migration tests.",
            )
            for topic in WORDS
        }

    def word(self) -> str:
        return "".join(self.r.choice(SYLLABLES) for _ in range(3))

    def event_id(self) -> str:
        self.n += 1
        return f"ev-{self.n:06d}"

    def results(self, topic: str, k: int, exclude: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
        pool = [o for o, _ in self.observations[topic] if o not in exclude]
        return self.r.sample(pool, min(k, len(pool)))

    def session(self, i: int) -> list[dict]:
        r = self.r
        sid = f"ses_{i:04d}"
        org = f"org_{r.choice(['acme', 'globex', 'initech'])}"
        scope = {
            "session_id": sid,
            "agent_id": r.choice(["noument", "coder-7", "reviewer"]),
            "org_id": org,
            "project_id": f"proj_{r.randint(1, 4)}",
        }
        topic = r.choice(list(TOPICS))
        t = BASE + timedelta(seconds=i * 37 + r.random() * 20)
        events: list[dict] = []

        def search(query: str, result_ids: list[str], source: str = "agent") -> None:
            events.append(
                {
                    "kind": "search",
                    "event_id": self.event_id(),
                    "ts": ts(t),
                    **scope,
                    "query": query,
                    "result_ids": result_ids,
                    "source": source,
                }
            )

        query = r.choice(TOPICS[topic])
        last = self.results(topic, 3)
        never_asked = r.random() < 0.06  # the agent never searched its memory
        if not never_asked:
            search(query, last)
        for _ in range(0 if never_asked else r.randint(0, 4)):
            move = r.random()
            if move < 0.35:  # refinement within the window, other results: a followup
                t += timedelta(seconds=r.uniform(2, 28))
                query = f"{query} {r.choice(WORDS[topic].split())}"
                last = self.results(topic, 3, set(last))
                search(query, last)
            elif move < 0.50:  # the same query again (retry): never a followup
                t += timedelta(seconds=r.uniform(1, 10))
                search(f"  {query.upper()} ", last)
            elif move < 0.62:  # refinement, but after the window
                t += timedelta(seconds=r.uniform(31, 300))
                query = f"{query} {r.choice(WORDS[topic].split())}"
                last = self.results(topic, 3, set(last))
                search(query, last)
            elif move < 0.74:  # refinement whose results overlap the previous ones
                t += timedelta(seconds=r.uniform(2, 28))
                query = f"{r.choice(WORDS[topic].split())} {query}"
                last = [last[0]] + self.results(topic, 2, set(last))
                search(query, last)
            elif move < 0.87:  # a human looking in the viewer
                t += timedelta(seconds=r.uniform(1, 20))
                search(r.choice(TOPICS[topic]), self.results(topic, 2), "viewer")
            else:  # memory had nothing
                t += timedelta(seconds=r.uniform(1, 20))
                search(f"{query} {r.choice(['edge case', 'legacy', 'v1'])}", [])
        injected = dict(self.observations[topic])
        stale_id, stale_text = self.stale[topic]
        misled = r.random() < 0.12
        for turn in range(0 if never_asked else r.randint(1, 3)):
            t += timedelta(seconds=r.uniform(0.5, 3))
            ids = r.sample(sorted(injected), r.randint(2, 4))
            if misled and turn == 0:
                injected[stale_id] = stale_text
                ids.insert(0, stale_id)
            injection = {
                "kind": "injection",
                "event_id": self.event_id(),
                "ts": ts(t),
                **scope,
                "turn_id": f"t{turn + 1}",
                "observations": [{"id": o, "content": injected[o]} for o in ids],
                "graph_entity_ids": [f"node_{topic}_{r.randint(1, 5)}"],
                "graph_edge_keys": [
                    {
                        "source_id": f"node_{topic}_1",
                        "target_id": f"node_{topic}_2",
                        "relationship": "DEPENDS_ON",
                    }
                ],
            }
            if topic == "deploy":
                # dead weight: injected into every deploy turn, never what an answer needs
                # (memdiag query unused-memories)
                injection["observations"].append(
                    {
                        "id": "obs_deploy_changelog",
                        "content": "Changelog entries are archived quarterly alongside release "
                        "notes.",
                    }  # fmt: skip
                )
            if misled and turn == 0 and topic == "billing":
                # the billing agent's knowledge graph still says invoices go to the legacy
                # ledger (in the seed's spelling): every session it misleads fails, so the
                # edge becomes misleading (memdiag query misleading --graph)
                injection["graph_entity_ids"].append("ledger_v1")
                injection["graph_edge_keys"].append(
                    {
                        "sourceId": "svc_billing",
                        "targetId": "ledger_v1",
                        "relationshipName": "WRITES_TO",
                    }  # fmt: skip
                )
            events.append(injection)
            # the response relies on some memories (repeating much of their wording) and
            # mentions a few topic words of its own
            used = []
            for o in ids:
                if r.random() < 0.5:
                    words = injected[o].split()
                    used.append(" ".join(w for w in words if r.random() < 0.7))
            filler = " ".join(r.sample(WORDS[topic].split(), 2))
            text = (" ".join(used) + f" Next I will look at the {filler}.").strip()
            t += timedelta(seconds=r.uniform(5, 40))
            events.append(
                {
                    "kind": "response",
                    "event_id": self.event_id(),
                    "ts": ts(t),
                    **scope,
                    "turn_id": f"t{turn + 1}",
                    "text": text,
                }
            )
        t += timedelta(seconds=r.uniform(30, 600))
        outcome = r.choices(["accepted", "rejected", "rework"], [0.6, 0.25, 0.15])[0]
        if misled or (never_asked and r.random() < 0.7):
            outcome = r.choice(["rejected", "rework"])
        calls = [{"tool": r.choice(TOOLS_OK), "file": f"src/{topic}.py", "success": True}]
        errors = []
        files = [f"src/{topic}.py"]
        if outcome != "accepted":
            failure = r.choice(["test", "style", "regression", "incomplete", "approach", "other"])
            if failure == "test":
                calls.append(
                    {
                        "tool": r.choice(TEST_TOOLS),
                        "file": f"tests/test_{topic}.py",
                        "success": False,
                    }
                )
                errors.append(
                    {"message": "2 tests failed", "tool": calls[-1]["tool"], "recoverable": False}
                )
            elif failure == "style":
                errors.append(
                    {"message": "eslint: 3 problems", "tool": "lint", "recoverable": True}
                )
            elif failure == "regression":
                errors.append(
                    {
                        "message": "this broke the checkout flow",
                        "tool": "bash",
                        "recoverable": False,
                    }
                )
            elif failure == "incomplete":
                files = []
            elif failure == "approach":
                errors.append(
                    {
                        "message": "reviewer: wrong abstraction",
                        "tool": "review",
                        "recoverable": True,
                    }
                )
        events.append(
            {
                "kind": "session_outcome",
                "event_id": self.event_id(),
                "ts": ts(t),
                **scope,
                "outcome": outcome,
                "tool_calls": calls,
                "files_modified": files,
                "errors": errors,
            }
        )
        return events


BAD_LINES = [
    "this line is not JSON",
    json.dumps(
        {
            "kind": "search",
            "event_id": "bad-1",
            "session_id": "ses_0001",
            "ts": "2026-11-21T08:00:01Z",
            "result_ids": [],
        }
    ),  # no query
    json.dumps(
        {
            "kind": "search",
            "event_id": "bad-2",
            "session_id": "ses_0002",
            "ts": "yesterday",
            "query": "x",
            "result_ids": [],
        }
    ),  # bad ts
    json.dumps(
        {
            "kind": "click",
            "event_id": "bad-3",
            "session_id": "ses_0003",
            "ts": "2026-11-21T08:00:01Z",
        }
    ),  # unknown kind
    json.dumps(
        {
            "kind": "response",
            "event_id": "x" * 200,
            "session_id": "ses_0004",
            "ts": "2026-11-21T08:00:01Z",
            "turn_id": "t1",
            "text": "hi",
        }
    ),  # id too long
]


#: the benchmark suite both runs answered (its checksum is what `memdiag gate` pairs on)
SUITE = {
    "suite_id": "longmem-s",
    "suite_version": "2026.11",
    "suite_checksum": "sha256:7d1e4c0b9a",
    "fixture_checksum": "sha256:52aa9f3e10",
}


def judgements(seed: int, questions: int = 150, repeats: int = 2) -> list[dict]:
    """Two benchmark runs over the same questions: a baseline, and a candidate whose
    reranker retrieves the gold evidence more often. Some of what it now retrieves the
    reader still gets wrong: part of its gain is retrieval failures turned reader failures.
    """
    r = random.Random(seed + 2)
    out: list[dict] = []
    t = BASE + timedelta(hours=3)
    for q in range(questions):
        qid = f"q{q:03d}"
        gold = [] if q % 25 == 0 else [f"obs_ev_{q:03d}_{k}" for k in range(r.choice([1, 1, 2]))]
        hard = r.random() < 0.25  # the reader struggles with this one whatever it gets
        for run, recall, extra_ms, extra_tokens, config, git in (
            ("longmem-baseline", 0.68, 0, 0, "cfg-hybrid-k8", "3f9c2e1"),
            ("longmem-rerank", 0.86, 140, 220, "cfg-hybrid-k8-rerank", "b41d07a"),
        ):
            for rep in range(repeats):
                rr = random.Random(f"{seed}-{run}-{qid}-{rep}")
                found = [g for g in gold if rr.random() < recall]
                noise = [f"obs_noise_{rr.randrange(5000):04d}" for _ in range(rr.randint(3, 6))]
                retrieved = found + noise
                rr.shuffle(retrieved)
                has_all = bool(gold) and len(found) == len(gold)
                if not gold:
                    correct = rr.random() < 0.5
                elif has_all:
                    correct = rr.random() < (0.45 if hard else 0.9)
                else:
                    correct = rr.random() < 0.08  # a lucky guess
                t += timedelta(seconds=r.uniform(0.5, 3))
                # graded: a right answer scores high, a wrong one low, partial evidence between
                share = len(found) / len(gold) if gold else 0.5
                score = (0.75 + 0.25 * rr.random()) if correct else 0.35 * share * rr.random()
                latency = round(rr.gauss(1800 + extra_ms, 250))
                input_tokens = round(rr.gauss(1400 + extra_tokens, 110))
                output_tokens = round(rr.gauss(200, 30))
                out.append(
                    {
                        "kind": "judgement",
                        "event_id": f"jd-{run}-{qid}-{rep}",
                        "ts": ts(t),
                        "run_id": run,
                        "question_id": qid,
                        "condition": "full-memory",
                        "repeat_index": rep,
                        "judge_correct": correct,
                        "gold_evidence_ids": gold,
                        "retrieved_context_ids": retrieved,
                        "latency_ms": latency,
                        "tokens": input_tokens + output_tokens,
                        "input_tokens": input_tokens,
                        "output_tokens": output_tokens,
                        "score": round(score, 3),
                        "duration_ms": latency + round(rr.uniform(300, 900)),  # judge included
                        **SUITE,
                        "run_group_id": "longmem-2026-11",
                        "config_fingerprint": config,
                        "git_head": git,
                        "service_version": "memory-service 4.2.0",
                    }
                )
    return out


#: (agent, episodes, episodes indexed before the indexer stops (None: all), distinctive
#: names?, slug of the names)
MEMORY_AGENTS = (
    ("archivist", 36, None, True, "archivist"),
    ("migrated-indexer", 30, 18, True, "ops-runbook"),
    ("cold-notes", 12, 0, True, "notes"),
    ("proving-medqa", 72, None, False, "proving-medqa"),
    ("swapped-embedder", 36, None, True, "handoff"),
)
#: the agent whose query embedder was swapped for one its index was not built with, and
#: when: every memory is still indexed (coverage 100%), no probe finds anything after it
SWAPPED, SWAP_AT = "swapped-embedder", BASE + timedelta(hours=4, minutes=15)
NAME_WORDS = (
    "rollback drill pager rotation quota bump vendor outage schema freeze canary split audit "
    "trail cache stampede budget review tenant split token leak retry storm index rebuild "
    "dashboard cleanup release train"
).split()


def probe_event(r: random.Random, eid: str, at: datetime, agent: str, mid: str,
                others: list[str], found: bool, ranked_low: bool) -> dict:  # fmt: skip
    """A recall probe of ``mid``: found, it is among the first three results above the
    threshold; not found, the results are ``others``, then ``mid`` below them if
    ``ranked_low`` (indexed, outranked by its look-alikes)."""
    if found:
        rank = r.choice([0, 0, 1, 2])
        results = others[:rank] + [mid] + others[rank:]
        scores = sorted((round(r.uniform(0.36, 0.82), 2) for _ in results), reverse=True)
    else:
        results = others + ([mid] if ranked_low else [])
        scores = sorted((round(r.uniform(0.2, 0.6), 2) for _ in results), reverse=True)
    return {"kind": "recall_probe", "event_id": eid, "ts": ts(at), "agent_id": agent,
            "memory_id": mid, "result_ids": results, "scores": scores, "k": 3,
            "threshold": 0.35}  # fmt: skip


def memory_agents(seed: int) -> list[dict]:
    """The recall pipeline's events: episodes written over five hours, indexed (or not), a
    probe sweep of every episode by its own name, and the latest ambient context (the last
    ten names)."""
    r = random.Random(seed + 3)
    out: list[dict] = []
    sweep = BASE + timedelta(hours=5, minutes=30)
    for agent, episodes, stops, distinctive, slug in MEMORY_AGENTS:
        span = 5 * 3600 / episodes
        ids = []
        for n in range(episodes):
            mid = f"ep-{slug}-{n:03d}"
            ids.append(mid)
            name = (
                f"{slug}-{r.choice(NAME_WORDS)}-{r.choice(NAME_WORDS)}-{n:03d}"
                if distinctive
                else f"{slug}-{n:03d}"
            )
            written = BASE + timedelta(seconds=n * span + r.uniform(0, span / 2))
            out.append({"kind": "memory_written", "event_id": f"mw-{agent}-{n:03d}",
                        "ts": ts(written), "agent_id": agent, "memory_id": mid, "name": name,
                        "store": "episodes"})  # fmt: skip
            indexed = stops is None or n < stops
            if indexed:
                out.append({"kind": "memory_indexed", "event_id": f"mi-{agent}-{n:03d}",
                            "ts": ts(written + timedelta(seconds=r.uniform(2, 45))),
                            "agent_id": agent, "memory_id": mid, "store": "chroma"})  # fmt: skip
            # the probe: a query made from the episode's name. Distinctive names are found
            # when indexed (nine in ten); repetitive ones lose to their look-alikes
            found = indexed and r.random() < (0.92 if distinctive else 0.4)
            found = found and not (agent == SWAPPED and sweep >= SWAP_AT)
            others = [f"ep-{slug}-{k:03d}" for k in r.sample(range(episodes), 4) if k != n][:3]
            out.append(probe_event(r, f"rp-{agent}-{n:03d}", sweep + timedelta(seconds=n),
                                   agent, mid, others, found,
                                   indexed and not distinctive))  # fmt: skip
        out.append({"kind": "ambient_context", "event_id": f"ac-{agent}",
                    "ts": ts(sweep + timedelta(minutes=5)), "agent_id": agent,
                    "session_id": f"ambient-{agent}", "memory_ids": ids[-10:]})  # fmt: skip
    return out


def memory_sweeps(memory: list[dict], seed: int) -> list[dict]:
    """Hourly probe sweeps before the last one, each of every memory written by then, and an
    ambient context after each (the last ten names then): the trends. Distinctive names are
    found nine in ten when indexed; repetitive ones less as their look-alikes pile up (the
    paper's "recall decays as memory grows"); the swapped embedder finds nothing after its
    swap."""
    r = random.Random(seed + 7)
    written: dict[str, list[tuple[datetime, str]]] = {}
    indexed: dict[str, datetime] = {}
    for e in memory:
        t = datetime.fromisoformat(e["ts"].replace("Z", "+00:00"))
        if e["kind"] == "memory_written":
            written.setdefault(e["agent_id"], []).append((t, e["memory_id"]))
        elif e["kind"] == "memory_indexed":
            indexed[e["memory_id"]] = t
    distinctive = {a: d for a, _, _, d, _ in MEMORY_AGENTS}
    out: list[dict] = []
    for hour in range(1, 6):
        sweep = BASE + timedelta(hours=hour)
        for agent, memories in written.items():
            ids = [mid for t, mid in sorted(memories) if t <= sweep - timedelta(minutes=1)]
            for n, mid in enumerate(ids):
                is_indexed = mid in indexed and indexed[mid] <= sweep
                odds = 0.92 if distinctive[agent] else min(0.92, 28 / len(ids))
                found = is_indexed and r.random() < odds
                found = found and not (agent == SWAPPED and sweep >= SWAP_AT)
                others = [o for o in r.sample(ids, min(4, len(ids))) if o != mid][:3]
                out.append(probe_event(r, f"rp-{agent}-h{hour}-{n:03d}",
                                       sweep + timedelta(seconds=n), agent, mid, others, found,
                                       is_indexed and not distinctive[agent]))  # fmt: skip
            out.append({"kind": "ambient_context", "event_id": f"ac-{agent}-h{hour}",
                        "ts": ts(sweep + timedelta(minutes=5)), "agent_id": agent,
                        "session_id": f"ambient-{agent}-h{hour}",
                        "memory_ids": ids[-10:]})  # fmt: skip
    return out


#: the agent that writes its own rules: each one's name finds it; a probe made from a clinical
#: presentation the rule should serve ("hot swollen first toe overnight, on a thiazide" for
#: the gout rule) finds only every fifth (the recall paper's clinical-presentation queries found
#: 1 of 5 self-authored rules; their names found them)
RULES_AGENT = "clinical-rules"
RULES = ("gout-urate-target", "af-anticoagulation", "hyperkalaemia-ecg", "sepsis-lactate",
         "dka-potassium", "copd-steroid-course", "pe-wells-score", "asthma-step-down",
         "ckd-metformin-dose", "stroke-thrombolysis-window")  # fmt: skip


def rules_agent(seed: int) -> list[dict]:
    """The rules agent's events, on a random generator of their own (the other agents' stay
    as they were): a rule written every twelve minutes and indexed within seconds, and each
    hour (and at the last sweep) a probe of every rule written by then made from its name
    (always found) and one made from its presentation (found only for every fifth rule: the
    rest come back below other rules the presentation's words match better), then an ambient
    context of the rules written by then."""
    r = random.Random(seed + 11)
    out: list[dict] = []
    ids = [f"rule-{name}" for name in RULES]
    written = []
    for n, name in enumerate(RULES):
        t = BASE + timedelta(minutes=12 * n, seconds=r.uniform(0, 300))
        written.append(t)
        out.append({"kind": "memory_written", "event_id": f"mw-{RULES_AGENT}-{n:03d}",
                    "ts": ts(t), "agent_id": RULES_AGENT, "memory_id": ids[n],
                    "name": f"{name}-rule.md", "store": "rules"})  # fmt: skip
        out.append({"kind": "memory_indexed", "event_id": f"mi-{RULES_AGENT}-{n:03d}",
                    "ts": ts(t + timedelta(seconds=r.uniform(2, 30))), "agent_id": RULES_AGENT,
                    "memory_id": ids[n], "store": "chroma"})  # fmt: skip
    sweeps = [BASE + timedelta(hours=h) for h in range(1, 6)]
    sweeps.append(BASE + timedelta(hours=5, minutes=30))
    for s, sweep in enumerate(sweeps):
        for n, mid in enumerate(ids):
            if written[n] > sweep - timedelta(minutes=1):
                continue
            others = [o for o in r.sample(ids, 4) if o != mid][:3]
            at = sweep + timedelta(seconds=30 + 2 * n)
            out.append(probe_event(r, f"rp-{RULES_AGENT}-s{s}-{n:03d}", at, RULES_AGENT, mid,
                                   others, True, False))  # fmt: skip
            task = probe_event(r, f"rt-{RULES_AGENT}-s{s}-{n:03d}", at + timedelta(seconds=1),
                               RULES_AGENT, mid, others, n % 5 == 0, True)  # fmt: skip
            out.append({**task, "query_source": "task"})
        out.append({"kind": "ambient_context", "event_id": f"ac-{RULES_AGENT}-s{s}",
                    "ts": ts(sweep + timedelta(minutes=5)), "agent_id": RULES_AGENT,
                    "session_id": f"ambient-{RULES_AGENT}-s{s}",
                    "memory_ids": [m for m, w in zip(ids, written, strict=True)
                                   if w <= sweep][-10:]})  # fmt: skip
    return out


#: (agent, its sessions' failure rate while its pipeline is healthy, during its break)
PIPELINE_SESSIONS = (("migrated-indexer", 0.45, 0.85), ("archivist", 0.45, 0.45))


def pipeline_sessions(seed: int) -> list[dict]:
    """Sessions of two memory agents, one every five minutes over the memory agents' five
    hours: the migrated indexer's fail more once its indexer stopped (its break: the
    episodes written after the 18th are never indexed), the archivist's never break. Each
    searches its agent's episodes, sometimes again, then ends."""
    r = random.Random(seed + 5)
    out: list[dict] = []
    stop = None  # when the migrated indexer's first never-indexed episode was written
    for e in memory_agents(seed):
        if e["kind"] == "memory_written" and e["memory_id"] == "ep-ops-runbook-018":
            stop = e["ts"]
    for agent, healthy, broken in PIPELINE_SESSIONS:
        for n in range(60):
            t = BASE + timedelta(minutes=5 * n, seconds=r.uniform(0, 240))
            sid = f"ses_{agent}_{n:02d}"
            scope = {"session_id": sid, "agent_id": agent}
            first = [f"ep-{agent}-{r.randrange(30):03d}"]
            out.append({"kind": "search", "event_id": f"s-{sid}", "ts": ts(t), **scope,
                        "query": f"{agent} runbook step {n}", "result_ids": first})  # fmt: skip
            # a second search, a followup (new query, new results, within the window) as
            # often as in the coding sessions and whatever the outcome: no signal of its own
            refine = r.random() < 0.45
            out.append({"kind": "search", "event_id": f"s2-{sid}",
                        "ts": ts(t + timedelta(seconds=r.uniform(5, 25))), **scope,
                        "query": f"{agent} runbook step {n} rollback" if refine
                        else f"{agent} runbook step {n}",
                        "result_ids": [f"ep-{agent}-{r.randrange(30, 60):03d}"] if refine
                        else first})  # fmt: skip
            end = t + timedelta(seconds=r.uniform(30, 50))
            during = agent == "migrated-indexer" and stop is not None and ts(end) >= stop
            failed = r.random() < (broken if during else healthy)
            calls = [{"tool": "edit", "file": "runbook.md", "success": True}]
            errors = []
            if failed:
                calls.append({"tool": "pytest", "file": "tests/test_runbook.py", "success": False})
                errors.append({"message": "1 test failed", "tool": "pytest", "recoverable": False})
            out.append({"kind": "session_outcome", "event_id": f"o-{sid}", "ts": ts(end),
                        **scope, "outcome": "rejected" if failed else "accepted",
                        "tool_calls": calls, "files_modified": ["runbook.md"],
                        "errors": errors})  # fmt: skip
    return out


def make(sessions: int, seed: int) -> list[str]:
    sample = Sample(seed)
    events = [e for i in range(sessions) for e in sample.session(i)]
    events += judgements(seed)
    memory = memory_agents(seed)
    events += memory + memory_sweeps(memory, seed) + rules_agent(seed)
    events += pipeline_sessions(seed)
    events.sort(key=lambda e: e["ts"])  # sessions interleave, as on a live stream (stable sort)
    lines = [json.dumps(e, separators=(",", ":")) for e in events]
    r = random.Random(seed + 1)
    for bad in BAD_LINES:
        lines.insert(r.randrange(len(lines)), bad)
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--sessions", type=int, default=300)
    parser.add_argument("--seed", type=int, default=20261121)
    args = parser.parse_args()
    lines = make(args.sessions, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {len(lines)} lines to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
