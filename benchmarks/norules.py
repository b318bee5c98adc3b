"""``memdiag worker`` with its session logic switched off: a bound, not a contender.

    .venv/bin/python benchmarks/norules.py worker

``benchmarks/pipeline.py --bound`` runs it beside the real worker. Every event still goes
through everything around the session logic: the fetch (Faust, aiokafka), the decoder and
its validation, the partition check, the session loaded from and written back to the store
once a checkpoint, the changelog, the checkpoint's commit. Only
:meth:`memdiag.streams.session.session.Session.ingest` does nothing: an event from the
``events`` topic makes no log record, no rule, no row, no counter, so nothing to send either
(spans' retrievals and turns, and owners' verdicts, still apply: the benchmark sends none),
and the sessions written back hold no log (smaller state values than the real worker's: that
difference is the logic's too). Its rate and CPU per event are what the worker would reach
if the session logic and what it sends and keeps cost nothing; the real worker's distance
from it is what that logic costs in the whole process (``benchmarks/stage.py`` measures the
stage in isolation).

It patches the class in this process, then hands the command line to memdiag's own
``main``: the production code has no switch for this.
"""

from __future__ import annotations

import sys
from typing import Any

from memdiag.cli import main
from memdiag.streams.session.session import Session


def _ingest_nothing(self: Session, *args: Any, **kwargs: Any) -> None:
    return None


if __name__ == "__main__":
    Session.ingest = _ingest_nothing  # type: ignore[method-assign]
    sys.exit(main(sys.argv[1:]))
