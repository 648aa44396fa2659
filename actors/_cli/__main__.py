"""`python -m steerable.actors._cli`: the `steerable` command without its console script."""

import sys

from .cli import main

sys.exit(main())
