"""`python -m tests.bench`: see `tests/bench/run.py`."""

from .run import main

raise SystemExit(main())
