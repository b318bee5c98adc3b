"""Used/ignored detector benchmark: observation-response pairs per second, on one core.

    .venv/bin/python benchmarks/feedback.py [--turns 20000]

Realistic turns: 4 to 8 injected observations of 200 to 600 characters, drawn from a pool
that repeats across sessions (as memory systems re-inject popular observations), and
responses of 1 to 4 KB that reuse some of the injected words. The baseline, in the same
run, only tokenises the responses: the floor of any correct implementation, since each
response must be read once.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from memdiag.streams.rules.feedback import judge_observation, keywords, response_words  # noqa: E402
from memdiag.streams.rules.turns import Turn  # noqa: E402

VOCAB = [
    "".join(
        random.Random(i).choices("abcdefghijklmnopqrstuvwxyz", k=random.Random(-i).randint(2, 11))
    )
    for i in range(6000)
]


def make_turns(n: int, seed: int = 11) -> list[tuple[list[str], str]]:
    r = random.Random(seed)

    def text(lo: int, hi: int) -> str:
        words, size, target = [], 0, r.randint(lo, hi)
        while size < target:
            w = r.choice(VOCAB) + r.choice(["", "", "", ",", ".", "-x", ";"])
            words.append(w.capitalize() if r.random() < 0.1 else w)
            size += len(w) + 1
        return " ".join(words)

    pool = [text(200, 600) for _ in range(3000)]
    turns = []
    for _ in range(n):
        obs = r.sample(pool, r.randint(4, 8))
        borrowed = " ".join(w for o in obs for w in o.split() if r.random() < 0.2)
        turns.append((obs, (borrowed + " " + text(1024, 4096))[: r.randint(1024, 4096)]))
    return turns


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=20_000)
    args = parser.parse_args()
    turns = make_turns(args.turns)
    pairs = sum(len(obs) for obs, _ in turns)

    t0 = time.perf_counter()
    for _, response in turns:
        response_words(response)
    baseline = time.perf_counter() - t0

    keywords.cache_clear()
    t0 = time.perf_counter()
    used = 0
    for obs, response in turns:
        words = response_words(response)
        for content in obs:
            used += judge_observation(content, words).signal == "used"
    detector = time.perf_counter() - t0

    # The worker's path: the turn join (keywords kept in state, then judged on the response),
    # injection first as in most sessions. Session state (de)serialisation is not included.
    keywords.cache_clear()
    t0 = time.perf_counter()
    joined = 0
    for obs, response in turns:
        t = Turn()
        t.add_injection(1, "i", 0, [(f"o{j}", keywords(c)) for j, c in enumerate(obs)])
        joined += len(t.add_response(2, "r", 0, response_words(response)))
    join = time.perf_counter() - t0
    assert joined == pairs

    print(f"{args.turns:,} turns, {pairs:,} observation-response pairs ({used / pairs:.0%} used)")
    print(f"detector:                 {pairs / detector:>10,.0f} pairs/s  ({detector:.2f} s)")
    print(f"turn join + detector:     {pairs / join:>10,.0f} pairs/s  ({join:.2f} s)")
    print(f"baseline (tokenise only): {pairs / baseline:>10,.0f} pairs/s  ({baseline:.2f} s)")
    print(
        f"ratio detector / baseline: {baseline / detector:.2f}; "
        f"turn join / baseline: {baseline / join:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
