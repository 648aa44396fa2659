"""`just bench`: run every workload of docs/benchmarks.md, print one table, write the JSON.

    python -m tests.bench [--quick] [--only W1,W3] [--no-pin] [--out FILE] [--markdown FILE]

Each case (a workload's steerable variant, or one of its floors) runs in a fresh subprocess, so
peak RSS and thread counts are its own; every case runs unpinned and pinned to one core
(`taskset -c 0`, else `os.sched_setaffinity`). `--quick` runs small counts, unpinned only, and
asserts outcomes only (final states, call counts, deliveries), never speed: the exit status is
non-zero if any case failed to produce its outcome.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .report import CASES, build_rows, render_markdown, render_text

ROOT = Path(__file__).resolve().parents[2]


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def run_case(module: str, case: str, pin: str, quick: bool, timeout: float) -> dict[str, Any]:
    """Run one case in a fresh subprocess; returns its payload (ok/result or error)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out_path = f.name
    cmd = [sys.executable, "-m", "tests.bench._child", module, case, out_path]
    if quick:
        cmd.append("--quick")
    if pin == "P":
        taskset = shutil.which("taskset")
        cmd = [taskset, "-c", "0", *cmd] if taskset else [*cmd, "--pin"]
    env = dict(os.environ, PYTHONHASHSEED="0")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
        try:
            payload: dict[str, Any] = json.loads(Path(out_path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            payload = {
                "ok": False,
                "error": f"exit {proc.returncode}, no result",
                "stderr": proc.stderr[-2000:],
            }
    except subprocess.TimeoutExpired:
        payload = {"ok": False, "error": f"timed out after {timeout:.0f}s"}
    finally:
        Path(out_path).unlink(missing_ok=True)
    payload["wall_seconds"] = time.perf_counter() - t0
    return payload


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small counts, outcomes only")
    parser.add_argument("--only", default="", help="comma-separated workload ids (W1,W3)")
    parser.add_argument("--no-pin", action="store_true", help="skip the pinned pass")
    parser.add_argument("--pin", action="store_true", help="add the pinned pass to --quick")
    parser.add_argument(
        "--out", default="", help="default bench/results/latest.json (quick: quick.json)"
    )
    parser.add_argument("--markdown", default="", help="also write the table as markdown here")
    args = parser.parse_args(argv)

    results_dir = ROOT / "bench" / "results"
    args.out = args.out or str(results_dir / ("quick.json" if args.quick else "latest.json"))
    only = {w.strip().upper() for w in args.only.split(",") if w.strip()}
    pins = ["U"] if args.no_pin or (args.quick and not args.pin) else ["U", "P"]
    timeout = 120.0 if args.quick else 600.0
    results: dict[str, dict[str, Any]] = {}
    failures: list[str] = []
    t_start = time.perf_counter()
    load_start = os.getloadavg()
    for wid, module, case in CASES:
        if only and wid.upper() not in only:
            continue
        key = f"{module}.{case}"
        for pin in pins:
            payload = run_case(module, case, pin, args.quick, timeout)
            results.setdefault(key, {})[pin] = payload
            state = "ok"
            if not payload.get("ok"):
                state = f"FAILED: {payload.get('error')}"
                failures.append(f"{wid} {key} [{pin}]: {payload.get('error')}")
                if payload.get("tb") or payload.get("stderr"):
                    print(payload.get("tb") or payload.get("stderr"), file=sys.stderr)
            elif "unavailable" in payload.get("result", {}):
                state = f"not available ({payload['result']['unavailable']})"
            load = payload.get("loadavg_1m", [0.0])[0]
            print(
                f"[{time.perf_counter() - t_start:6.1f}s] {wid} {key:<32} {pin}  "
                f"{payload['wall_seconds']:5.1f}s  load {load:4.2f}  {state}",
                flush=True,
            )

    rows = build_rows(results, pins)
    if only:
        rows = [r for r in rows if str(r["workload"]).upper() in only]
    print()
    print(render_text(rows, pins))
    meta = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": _git_commit(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "quick": args.quick,
        "pins": pins,
        "seconds": time.perf_counter() - t_start,
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"meta": meta, "rows": rows, "cases": results}, indent=1, default=str),
        encoding="utf-8",
    )
    print(
        f"\nwrote {out} ({meta['seconds']:.0f}s in all; 1-min load average "
        f"{load_start[0]:.2f} at start, {meta['loadavg_end'][0]:.2f} at end, "
        f"{os.cpu_count()} CPUs)"
    )
    if args.markdown:
        Path(args.markdown).write_text(
            f"<!-- {json.dumps(meta)} -->\n" + render_markdown(rows, pins) + "\n",
            encoding="utf-8",
        )
        print(f"wrote {args.markdown}")
    if failures:
        print("\nFAILED (wrong or missing outcome):", file=sys.stderr)
        for f in failures:
            print(f"  {f}", file=sys.stderr)
        return 1
    return 0
