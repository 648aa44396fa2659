# steerable's tasks. `just check` is the one gate: format, lint, types, tests, examples.

set shell := ["bash", "-euo", "pipefail", "-c"]

py := if path_exists(".venv/bin/python") == "true" { ".venv/bin/python" } else { "python3" }

default:
    @just --list

# Format check, lint, strict types, then the whole test suite.
check: lint typecheck test

# Run the test suite (extra arguments go to pytest).
test *args:
    {{py}} -m pytest {{args}}

# Ruff format check and lint.
lint:
    {{py}} -m ruff format --check .
    {{py}} -m ruff check .

# Install Debian's Chromium for the browser tests (the web example's page, the HTML timeline),
# as .ci/run does.
browser:
    if [ -x /usr/bin/chromium ]; then /usr/bin/chromium --version; exit 0; fi; \
    sudo=""; if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi; \
    $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium

# Rewrite files with ruff's formatter and safe fixes.
fmt:
    {{py}} -m ruff format .
    {{py}} -m ruff check --fix .

# mypy --strict on actors, protocol, tests and examples.
# mypy cannot follow setuptools' editable import hook, so it reads the packages through a
# link tree that mirrors the installed layout (steerable.actors -> actors/).
typecheck:
    mkdir -p .typecheck/steerable
    ln -sfn ../../actors .typecheck/steerable/actors
    ln -sfn ../../protocol .typecheck/steerable/protocol
    MYPYPATH=.typecheck {{py}} -m mypy -p steerable.protocol -p steerable.actors
    MYPYPATH=.typecheck {{py}} -m mypy tests examples

# The benchmark suite (docs/benchmarks.md W1-W13 and their floors, unpinned and pinned to one core):
# prints one table, writes bench/results/latest.json. `just bench --quick` = `just bench-quick`.
bench *args:
    {{py}} -m tests.bench {{args}}

# The tests (extra arguments go to pytest) against a throwaway PostgreSQL started from the
# machine's binaries (scripts/pg-server; unix socket only), stopped afterwards, as .ci/run does.
# `just test-pg tests/test_postgres.py` runs one file.
test-pg *args:
    dir=$(mktemp -d /tmp/steerable-pg.XXXXXX); \
    trap 'scripts/pg-server stop "$dir"; rm -rf "$dir"' EXIT; \
    export STEERABLE_PG_DSN=$(scripts/pg-server start "$dir") STEERABLE_PG_DIR="$dir"; \
    {{py}} -m pytest {{args}}

# A PostgreSQL for development in /tmp/steerable-pg-dev (`just pg stop` stops it): prints the
# DSN to export as STEERABLE_PG_DSN (and STEERABLE_PG_DIR=/tmp/steerable-pg-dev for restarts).
pg action="start":
    if [ "{{action}}" = start ]; then scripts/pg-server start /tmp/steerable-pg-dev; \
    else scripts/pg-server stop /tmp/steerable-pg-dev && rm -rf /tmp/steerable-pg-dev; fi

# A short pass (< 2 min) proving every workload runs and ends as expected; asserts no speed.
bench-quick *args:
    {{py}} -m tests.bench --quick {{args}}
