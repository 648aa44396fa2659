"""steerable's benchmark suite: the workloads W1-W13 of docs/benchmarks.md and their floors.

Not collected by pytest (`norecursedirs`). Run it with `just bench` (full: unpinned and pinned
to one core) or `just bench-quick` (small counts; checks outcomes only). See
docs/performance.md.
"""
