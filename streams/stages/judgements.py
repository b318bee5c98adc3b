"""Benchmark judgements (docs/rules.md, "Benchmark judgement").

In a benchmark harness the truth is known, so every wrong answer is attributed:

- ``reader_failure``: all the gold evidence was in the retrieved context and the answer was
  still wrong (improve the reader, not retrieval);
- ``retrieval_failure``: some gold evidence never reached the context;
- ``unattributed``: the question has no gold evidence to check against.

:func:`failure_mode` is the rule, pure. :class:`JudgementStage` is the worker's logic
for ``memdiag.judgements``: validate, attribute, emit one ``judgement`` diagnostic keyed by
``run_id``. It keeps no state: the record is a function of the event alone. The sink keeps
every judgement once per ``(run_id, event_id)`` (``judgement_artifacts``: never
overwritten) and, per ``(run_id, question_id, condition, repeat_index)``, the one that
counts (the latest ``ts``, ties by ``event_id``), so a redelivery or a replay changes
nothing.
"""

from __future__ import annotations

from typing import Any

from memdiag.contract import (
    READER_FAILURE,
    READER_FAILURES,
    RETRIEVAL_FAILURE,
    RETRIEVAL_FAILURES,
)
from memdiag.contract.envelope import InMessage, Output
from memdiag.schemas import JUDGEMENT_KINDS
from memdiag.schemas.deadletters import add_dead_letter
from memdiag.schemas.decode import Decoder
from memdiag.schemas.models import Judgement, format_ts
from memdiag.settings import Settings
from memdiag.streams.rules.diagnosis import failure_mode

#: the optional fields a judgement carries to DuckDB as they came: graded score, token split,
#: and the run's provenance (contract section 2)
JUDGEMENT_EXTRAS = (
    "input_tokens",
    "output_tokens",
    "score",
    "duration_ms",
    "run_group_id",
    "suite_id",
    "suite_version",
    "suite_checksum",
    "fixture_checksum",
    "config_fingerprint",
    "git_head",
    "service_version",
    "label_status",
    "split",
)


class JudgementStage:
    def __init__(self, settings: Settings):
        self.settings = settings
        self._decoder = Decoder(
            JUDGEMENT_KINDS,
            settings.topics.judgements,
            settings.max_event_bytes,
            settings.max_skew_us,
        )

    held_bytes = 0

    def settle(self, store: Any) -> None:
        """Nothing held: every batch writes what it changed."""

    def reset(self) -> None:
        pass  # stateless

    def process(self, msgs: list[InMessage], store: Any = None) -> Output:
        out = Output()
        for msg in msgs:
            self._one(msg, out)
        return out

    def _one(self, msg: InMessage, out: Output) -> None:
        decoded = self._decoder.decode(msg.value, msg.timestamp_ms)
        for rejected in decoded.rejected:
            add_dead_letter(out, msg, rejected, self.settings)
        for acc in decoded.accepted:
            j: Judgement = acc.event  # type: ignore[assignment]
            mode = failure_mode(j.judge_correct, j.gold_evidence_ids, j.retrieved_context_ids)
            out.diagnostic(
                j.run_id,
                {
                    "kind": "judgement",
                    "event_id": j.event_id,
                    "run_id": j.run_id,
                    "question_id": j.question_id,
                    "condition": j.condition,
                    "repeat_index": j.repeat_index,
                    "judge_correct": j.judge_correct,
                    "failure_mode": mode,
                    "gold_evidence_ids": list(j.gold_evidence_ids),
                    "retrieved_context_ids": list(j.retrieved_context_ids),
                    "gold_retrieved": len(set(j.gold_evidence_ids) & set(j.retrieved_context_ids)),
                    "latency_ms": j.latency_ms,
                    "tokens": j.tokens,
                    **{name: getattr(j, name) for name in JUDGEMENT_EXTRAS},
                    "ts": format_ts(j.ts_us),
                },
            )
            out.ts_us = max(out.ts_us, j.ts_us)
            if mode == READER_FAILURE:
                out.count(READER_FAILURES, at_us=j.ts_us, run_id=j.run_id)
            elif mode == RETRIEVAL_FAILURE:
                out.count(RETRIEVAL_FAILURES, at_us=j.ts_us, run_id=j.run_id)
