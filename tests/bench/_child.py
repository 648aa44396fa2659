"""Runs one benchmark case in this (fresh) process and writes its result as JSON.

    python -m tests.bench._child MODULE CASE OUT.json [--quick]

The orchestrator (`tests/bench/run.py`) starts one of these per case and pinning, so peak RSS
and thread counts belong to that case alone. Pinning is applied by the parent (`taskset -c 0`
prefix, else `os.sched_setaffinity` here before anything starts a thread).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
from typing import Any

from ._common import OutcomeError


def main(argv: list[str]) -> int:
    module_name, case_name, out_path = argv[:3]
    quick = "--quick" in argv[3:]
    if "--pin" in argv[3:]:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    payload: dict[str, Any]
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    try:
        module = importlib.import_module(f"tests.bench.{module_name}")
        result = module.CASES[case_name](quick)
        payload = {"ok": True, "result": result}
        code = 0
    except OutcomeError as exc:
        payload = {"ok": False, "error": f"wrong outcome: {exc}"}
        code = 1
    except BaseException as exc:
        payload = {
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}",
            "tb": traceback.format_exc(),
        }
        code = 2
    payload["seconds"] = time.perf_counter() - t0
    # The machine is shared: the 1-minute load average around the case says how noisy it was.
    payload["loadavg_1m"] = [load_before, os.getloadavg()[0]]
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(payload, f)
    sys.stdout.flush()
    # Abandoned tool threads (W3, W7 non-cooperative variants) may still be sleeping: they are
    # daemon threads, but skip interpreter teardown so they cannot delay the exit.
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
