"""Make the bundled demo sample: realistic agent sessions, deterministically.

    python scripts/make_sample.py memdiag/data/sample.jsonl [--sessions 300] [--seed 20261121]

Same arguments, same bytes (a test checks the bundled file against a fresh run). Each
session searches its memory (refinements within the followup window, retries of the same
query, late searches, searches whose results overlap, viewer searches, empty results), gets
memories injected, answers, and ends accepted, rejected or reworked. A few deliberately bad
lines show the dead-letter path.
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
                picked = self.r.sample(vocab, 6)
                text = (
                    f"The {picked[0]} and the {picked[1]} depend on {picked[2]}; "
                    f"check {picked[3]} before changing {picked[4]} or {picked[5]}."
                )
                obs.append((f"obs_{topic}_{i:02d}", text))
            self.observations[topic] = obs

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
        search(query, last)
        for _ in range(r.randint(0, 4)):
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
        for turn in range(r.randint(1, 3)):
            t += timedelta(seconds=r.uniform(0.5, 3))
            ids = r.sample(sorted(injected), r.randint(2, 4))
            events.append(
                {
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
            )
            used = [injected[o] for o in ids if r.random() < 0.5]
            filler = " ".join(r.sample(WORDS[topic].split(), 3))
            text = (" ".join(used) + f" I will look at the {filler} next.").strip()
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


def make(sessions: int, seed: int) -> list[str]:
    sample = Sample(seed)
    events = [e for i in range(sessions) for e in sample.session(i)]
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
