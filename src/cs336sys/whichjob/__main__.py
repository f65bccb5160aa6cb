"""`python -m cs336sys.whichjob which PATH...` / `rule RULE` (the usage: cs336sys.whichjob.cli)."""

import sys

from cs336sys.whichjob.cli import main

sys.exit(main())
