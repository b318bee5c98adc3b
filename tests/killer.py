"""``python -m tests.killer STEP RECORDS``: ``memdiag worker`` that kills itself (SIGKILL, as an
OOM killer or a lost machine does) at ``STEP`` of the first commit, after at least one
landed, that produces at least ``RECORDS`` changelog records (``changelog``: once it has sent
that many, ``delivered``, ``committed``: ``memdiag.streams.checkpoint``), for the integration
test of the checkpoint. Its settings come from the environment, as the worker's.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from memdiag.streams import runner


def main() -> int:
    step, records = sys.argv[1], int(sys.argv[2])
    landed = [0]
    original = runner.Runner.__init__

    def fault(at: str, n: int) -> None:
        if at == "written":
            landed[0] += 1
            return
        if landed[0] < 1 or at != step or n < records:
            return
        sys.stderr.write(f"killer: killing the worker at {at} ({n} changelog records) of "
                         f"commit {landed[0] + 1}\n")  # fmt: skip
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.fault = fault

    runner.Runner.__init__ = init  # type: ignore[method-assign]
    from memdiag.cli import main as cli

    sys.argv = ["memdiag", "worker"]
    return cli()


if __name__ == "__main__":
    sys.exit(main())
