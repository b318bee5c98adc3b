"""``python -m memdiag.cli``: the ``memdiag`` command."""

import sys

from memdiag.cli import main

sys.exit(main())
