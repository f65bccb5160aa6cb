"""`python -m cs336sys.bench`: the benchmarking script's command line (`cs336sys.bench.cli`)."""

from cs336sys.bench.cli import main

main()
