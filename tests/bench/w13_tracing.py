"""W13: tracing overhead. W1 (200 iterations of decide -> 1 no-op tool) with no provider, with
the OpenTelemetry API's no-op provider, and with the SDK exporting to memory.

The three runtimes live in one process and their runs are interleaved (none, no-op, SDK, none,
...), so the overheads are measured against the same machine state. Figures: µs per iteration
for each (wall time from `start()` to `result()`), the SDK's also until every span is exported
(`flush_observers()`), and the no-op and SDK overheads over no provider, in percent.
"""

from __future__ import annotations

import time
from typing import Any

from steerable.actors import Runtime

from ._common import Result, cpu_note, expect, metric
from .w1_loop import LoopAgent, config_for, noop

N = 200


def _reps(quick: bool) -> int:
    return 3 if quick else 21


def case_overhead(quick: bool) -> Result:
    """W1 at 200 iterations: no provider / no-op provider / SDK with an in-memory exporter."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import NoOpTracerProvider

    exporter = InMemorySpanExporter()
    sdk = TracerProvider()
    sdk.add_span_processor(SimpleSpanProcessor(exporter))
    runtimes = {
        "none": Runtime(tools=[noop]),
        "noop": Runtime(tools=[noop], tracer_provider=NoOpTracerProvider()),
        "sdk": Runtime(tools=[noop], tracer_provider=sdk),
    }
    samples: dict[str, list[float]] = {name: [] for name in runtimes}
    drained: list[float] = []
    try:
        for rep in range(_reps(quick) + 1):  # the first round warms up
            for name, rt in runtimes.items():
                exporter.clear()
                t0 = time.perf_counter()
                handle = rt.start("w13", agent=LoopAgent(N), config=config_for(N))
                out = handle.result(timeout=120)
                t1 = time.perf_counter()
                expect(rt.flush_observers(120), f"W13 {name}: spans not exported")
                t2 = time.perf_counter()
                expect(out.metrics.steps == N, f"W13 {name}: {out.metrics.steps} steps")
                if name == "sdk":
                    spans = len(exporter.get_finished_spans())
                    expect(spans == 2 * N + 2, f"W13 sdk: {spans} spans, not {2 * N + 2}")
                if rep:
                    samples[name].append((t1 - t0) / N * 1e6)
                    if name == "sdk":
                        drained.append((t2 - t0) / N * 1e6)
    finally:
        for rt in runtimes.values():
            rt.shutdown()
        sdk.shutdown()

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    base = median(samples["none"])
    metrics: dict[str, Any] = {
        f"us_per_iter_{name}": metric(values, "µs/iter") for name, values in samples.items()
    }
    metrics["us_per_iter_sdk_exported"] = metric(drained, "µs/iter")
    for name in ("noop", "sdk"):
        pct = [(v / base - 1) * 100 for v in samples[name]]
        metrics[f"overhead_{name}_pct"] = metric(pct, "%")
    return {"metrics": metrics, "info": cpu_note(), "config": "W1 n=200, MemoryStore"}


CASES = {"overhead": case_overhead}
