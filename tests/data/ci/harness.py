"""A stand-in benchmark harness for the worked CI example: it "answers" a fixed suite of
120 questions twice with the memory configuration it is given, and prints one judgement
event per answer. The configuration (TOML) says how often retrieval finds the gold
evidence (`recall`), how often the reader then answers right (`reader`), and the extra
latency and tokens it costs; the same configuration always gives the same judgements."""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import tomllib
from datetime import UTC, datetime, timedelta

SUITE = {"suite_id": "standin", "suite_version": "1", "suite_checksum": "sha256:standin-1"}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--run-id", required=True)
    args = ap.parse_args()
    raw = open(args.config, "rb").read()
    config = tomllib.loads(raw.decode())
    fingerprint = "sha256:" + hashlib.sha256(raw).hexdigest()[:12]
    t = datetime(2026, 11, 24, 9, 0, tzinfo=UTC)
    for q in range(120):
        gold = [f"ev_{q:03d}"]
        for rep in range(2):
            rng = random.Random(f"{q}-{rep}-{config['recall']}-{config['reader']}")
            found = rng.random() < config["recall"]
            noise = [f"noise_{rng.randrange(999):03d}" for _ in range(4)]
            context = ([gold[0]] if found else []) + noise
            correct = rng.random() < (config["reader"] if found else 0.1)
            latency = round(rng.gauss(1500 + config.get("extra_ms", 0), 100))
            t += timedelta(seconds=1)
            event = {
                "kind": "judgement",
                "event_id": f"{args.run_id}-{q}-{rep}",
                "ts": t.isoformat().replace("+00:00", "Z"),
                "run_id": args.run_id,
                "question_id": f"q{q:03d}",
                "condition": "memory",
                "repeat_index": rep,
                "judge_correct": correct,
                "score": round(0.8 + 0.2 * rng.random() if correct else 0.2 * rng.random(), 3),
                "gold_evidence_ids": gold,
                "retrieved_context_ids": context,
                "latency_ms": latency,
                "input_tokens": 1200 + config.get("extra_tokens", 0),
                "output_tokens": 150,
                **SUITE,
                "config_fingerprint": fingerprint,
            }
            sys.stdout.write(json.dumps(event) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
