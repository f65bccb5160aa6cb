"""`python -m cs336sys.whichjob`, the same as `python -m cs336sys.jobs which|rule`."""

import sys

from cs336sys.whichjob.cli import main

sys.exit(main())
