"""The table: which figure of which case is reported, against which floor, target and anchor.

Targets and anchors are copied from docs/benchmarks.md. A target applies to the
unpinned ("U") and/or pinned ("P") figure, as docs/benchmarks.md states it; where it names neither,
both are judged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._common import summarise

__all__ = ["CASES", "ROWS", "Row", "build_rows", "render_markdown", "render_text"]

# (workload, module, case), in the order they run.
CASES: list[tuple[str, str, str]] = [
    ("W1", "w1_loop", "floor_loop"),
    ("W1", "w1_loop", "floor_pykka"),
    ("W1", "w1_loop", "memory"),
    ("W1", "w1_loop", "sqlite"),
    ("W1", "w1_loop", "leases_memory"),
    ("W1", "w1_loop", "leases_sqlite"),
    ("W1", "w1_loop", "rich_events"),
    ("W2", "w2_parallel", "floors"),
    ("W2", "w2_parallel", "sync_prestart"),
    ("W2", "w2_parallel", "sync_cold"),
    ("W2", "w2_parallel", "async"),
    ("W2", "w2_parallel", "sync_10"),
    ("W3", "w3_cancel", "floor"),
    ("W3", "w3_cancel", "cooperative"),
    ("W3", "w3_cancel", "noncooperative"),
    ("W3p", "w3p_process", "kill"),
    ("W3p", "w3p_process", "overhead"),
    ("W3p", "w3p_process", "ray"),
    ("W4", "w4_checkpoint", "memory"),
    ("W4", "w4_checkpoint", "sqlite"),
    ("W5", "w5_concurrent", "floor_asyncio"),
    ("W5", "w5_concurrent", "floor_threads"),
    ("W5", "w5_concurrent", "steerable"),
    ("W6", "w6_steering", "floor"),
    ("W6", "w6_steering", "steerable"),
    ("W7", "w7_timeout", "floor"),
    ("W7", "w7_timeout", "cooperative"),
    ("W7", "w7_timeout", "noncooperative"),
    ("W8", "w8_parked", "floor_asyncio"),
    ("W8", "w8_parked", "steerable"),
    ("W9", "w9_durable", "floors"),
    ("W9", "w9_durable", "memory"),
    ("W9", "w9_durable", "sqlite"),
    ("W10", "w10_steering", "floor"),
    ("W10", "w10_steering", "steerable"),
    ("W11", "w11_takeover", "steerable"),
    ("W9pg", "w9_durable", "floors_postgres"),
    ("W9pg", "w9_durable", "postgres"),
    ("W4pg", "w4_checkpoint", "postgres"),
    ("W10pg", "w10_postgres", "floor"),
    ("W10pg", "w10_postgres", "steerable"),
    ("W10pg", "w10_postgres", "listener_killed"),
    ("W11pg", "w10_postgres", "takeover"),
    ("W12", "w12_loop_lag", "steerable"),
    ("W12", "w12_loop_lag", "frozen"),
    ("W12", "w12_loop_lag", "tuned"),
    ("W13", "w13_tracing", "overhead"),
]

Target = tuple[str, float]  # ("<=" | ">=", value)


@dataclass(frozen=True)
class Row:
    """One line of the table."""

    wid: str
    label: str
    case: str  # "module.case"
    metric: str
    stat: str = (
        "median"  # "median", "p99", "max" or "all" (a yes/no that must hold in every sample)
    )
    floors: tuple[tuple[str, str, str], ...] = ()  # (short name, "module.case", metric)
    targets: dict[str, Target] = field(default_factory=dict)  # {"U": ..., "P": ...}
    target_text: str = ""
    anchor: str = ""
    note: str = ""  # shown instead of figures (e.g. "not supported")
    # The most a ratio to a floor may be for the target to be met (a throughput's ratio is
    # floor / figure: "≥ 0.3x the floor" is a ratio of at most 1 / 0.3).
    ratio_max: float | None = None


def _both(op: str, value: float) -> dict[str, Target]:
    return {"U": (op, value), "P": (op, value)}


_PYKKA = ("pykka", "w1_loop.floor_pykka", "")
_LOOP = ("loop", "w1_loop.floor_loop", "")


def _w1(n: int, target: bool) -> Row:
    m = f"us_per_iter_{n}"
    return Row(
        "W1",
        f"µs/iter, {n:,} iters, memory",
        "w1_loop.memory",
        m,
        floors=((_PYKKA[0], _PYKKA[1], m), (_LOOP[0], _LOOP[1], m)),
        targets={"U": ("<=", 100), "P": ("<=", 60)} if target else {},
        target_text="≤100 U, ≤60 P" if target else "",
        anchor="pykka 86; teaching 159; LangGraph 1,299" if n == 200 else "",
    )


ROWS: list[Row] = [
    Row(
        "W1",
        "floor: plain loop µs/iter, 200",
        "w1_loop.floor_loop",
        "us_per_iter_200",
        anchor="0.36",
    ),
    Row(
        "W1",
        "floor: raw pykka 2 asks µs/iter, 200",
        "w1_loop.floor_pykka",
        "us_per_iter_200",
        anchor="86",
    ),
    _w1(50, False),
    _w1(200, True),
    _w1(2000, False),
    Row(
        "W1",
        "flatness µs/iter 2,000 / 50",
        "w1_loop.memory",
        "flatness_2000_vs_50",
        targets={"P": ("<=", 1.2)},
        target_text="≤1.2 P",
        anchor="Agents SDK 2.8 (grows)",
    ),
    Row(
        "W1",
        "µs/iter, 200 iters, SqliteStore",
        "w1_loop.sqlite",
        "us_per_iter_200",
        floors=(("pykka", "w1_loop.floor_pykka", "us_per_iter_200"),),
        targets=_both("<=", 300),
        target_text="≤300",
        anchor="LangGraph SqliteSaver 4,383",
    ),
    Row(
        "W1",
        "leases on vs off, memory, 200 iters: overhead %",
        "w1_loop.leases_memory",
        "leases_overhead_pct",
        targets=_both("<=", 10),
        target_text="≤10%",
    ),
    Row(
        "W1",
        "leases on vs off, SqliteStore, 200 iters: overhead %",
        "w1_loop.leases_sqlite",
        "leases_overhead_pct",
        targets=_both("<=", 10),
        target_text="≤10%",
    ),
    Row(
        "W1",
        "richer events vs thin ones, memory, 200 iters: CPU overhead %",
        "w1_loop.rich_events",
        "rich_events_cpu_overhead_pct",
        targets=_both("<=", 5),
        target_text="≤5%",
    ),
    Row("W2", "floor: 100 threads, ms", "w2_parallel.floors", "threads_ms", anchor="73"),
    Row("W2", "floor: ThreadPoolExecutor(100), ms", "w2_parallel.floors", "pool100_ms"),
    Row("W2", "floor: asyncio.gather, ms", "w2_parallel.floors", "gather_ms", anchor="52"),
    Row(
        "W2",
        "sync @100, prestart_workers=100, ms",
        "w2_parallel.sync_prestart",
        "wall_ms",
        floors=(
            ("threads", "w2_parallel.floors", "threads_ms"),
            ("pool", "w2_parallel.floors", "pool100_ms"),
        ),
        targets=_both("<=", 60),
        target_text="≤60",
        anchor="LangGraph 102 (max_conc=100)",
    ),
    Row(
        "W2",
        "sync @100: starts of the 100 calls, first->last ms",
        "w2_parallel.sync_prestart",
        "dispatch_spread_ms",
    ),
    Row(
        "W2",
        "sync @100, cold Runtime(), ms",
        "w2_parallel.sync_cold",
        "wall_ms",
        floors=(("threads", "w2_parallel.floors", "threads_ms"),),
    ),
    Row(
        "W2",
        "async @100, ms",
        "w2_parallel.async",
        "wall_ms",
        floors=(("gather", "w2_parallel.floors", "gather_ms"),),
        targets=_both("<=", 55),
        target_text="≤55",
        anchor="LangGraph 74.5; SDK 107",
    ),
    Row(
        "W2",
        "async @100: starts of the 100 calls, first->last ms",
        "w2_parallel.async",
        "dispatch_spread_ms",
    ),
    Row(
        "W2",
        "sync @10, ms",
        "w2_parallel.sync_10",
        "wall_ms",
        floors=(("pool10", "w2_parallel.floors", "pool10_ms"),),
        targets=_both("<=", 520),
        target_text="≤520",
    ),
    Row("W3", "floor: polled event, set->join ms", "w3_cancel.floor", "cancel_ms", anchor="1.3"),
    Row(
        "W3",
        "cooperative: cancel->CANCELLED ms p50",
        "w3_cancel.cooperative",
        "cancel_ms",
        floors=(("event", "w3_cancel.floor", "cancel_ms"),),
        targets=_both("<=", 1),
        target_text="≤1",
        anchor="pykka 1.7; LangGraph 0.3*",
    ),
    Row(
        "W3",
        "cooperative: cancel->CANCELLED ms p99",
        "w3_cancel.cooperative",
        "cancel_ms",
        stat="p99",
        targets=_both("<=", 5),
        target_text="≤5",
    ),
    Row(
        "W3",
        "cooperative: tool stopped at result()",
        "w3_cancel.cooperative",
        "tool_stopped",
        stat="all",
        targets=_both(">=", 1),
        target_text="yes",
        anchor="peers: sync tool keeps running",
    ),
    Row(
        "W3",
        "sleep(10), grace 50 ms: ms p50",
        "w3_cancel.noncooperative",
        "cancel_ms",
        targets=_both("<=", 55),
        target_text="≤55 (grace+5)",
    ),
    Row(
        "W3",
        "sleep(10), grace 50 ms: ms p99",
        "w3_cancel.noncooperative",
        "cancel_ms",
        stat="p99",
        targets=_both("<=", 55),
        target_text="≤55 (grace+5)",
    ),
    Row(
        "W3",
        "sleep(10): call reported abandoned",
        "w3_cancel.noncooperative",
        "abandoned_reported",
        stat="all",
        targets=_both(">=", 1),
        target_text="yes",
    ),
    *(
        Row(
            "W3p",
            f"process, {label}, grace 50 ms: {what} ms {stat}",
            "w3p_process.kill",
            f"{metric}_ms_{short}",
            stat=stat,
            targets=_both("<=", 100),
            target_text="≤100 (grace+50)",
        )
        for label, short in (("C busy loop", "spin"), ("sleep(3600)", "sleep"))
        for what, metric in (("cancel->CANCELLED", "cancel"), ("cancel->process gone", "gone"))
        for stat in ("median", "p99")
    ),
    Row(
        "W3p",
        "process: call reported killed",
        "w3p_process.kill",
        "killed_reported",
        stat="all",
        targets=_both(">=", 1),
        target_text="yes",
    ),
    Row(
        "W3p",
        "no-op call µs, process-isolated (warm)",
        "w3p_process.overhead",
        "us_per_call_process",
        floors=(("thread", "w3p_process.overhead", "us_per_call_thread"),),
        target_text="report",
    ),
    Row(
        "W3p",
        "no-op call µs, worker thread",
        "w3p_process.overhead",
        "us_per_call_thread",
    ),
    Row(
        "W3p",
        "process isolation overhead µs/call",
        "w3p_process.overhead",
        "overhead_us",
        target_text="report",
    ),
    Row(
        "W3p",
        "no-op call µs, Ray task",
        "w3p_process.ray",
        "us_per_call_ray",
        floors=(("thread", "w3p_process.overhead", "us_per_call_thread"),),
        target_text="report",
    ),
    Row(
        "W3p",
        "Ray: cancel->CANCELLED ms",
        "w3p_process.ray",
        "cancel_ms_ray",
        target_text="report",
    ),
    Row(
        "W4",
        "memory: µs/checkpoint @iter 10",
        "w4_checkpoint.memory",
        "ckpt_us_iter10",
        floors=(("packb", "w4_checkpoint.memory", "floor_packb_us_iter10"),),
        targets=_both("<=", 30),
        target_text="≤30",
        anchor="LangGraph +1,885 µs/iter (InMemorySaver)",
    ),
    Row(
        "W4",
        "memory: µs/checkpoint @iter 1,000",
        "w4_checkpoint.memory",
        "ckpt_us_late",
        floors=(("packb", "w4_checkpoint.memory", "floor_packb_us_late"),),
        targets=_both("<=", 30),
        target_text="≤30",
    ),
    Row(
        "W4",
        "memory: flatness 1,000 / 10",
        "w4_checkpoint.memory",
        "flatness",
        targets=_both("<=", 1.2),
        target_text="flat (≤1.2)",
    ),
    Row(
        "W4",
        "memory: bytes held / transcript",
        "w4_checkpoint.memory",
        "bytes_vs_transcript",
        targets=_both("<=", 3),
        target_text="≤3",
        anchor="LangGraph 28.9 MB for 200 iters",
    ),
    Row("W4", "memory: µs/iter (1,000 iters, 200 B)", "w4_checkpoint.memory", "us_per_iter"),
    Row(
        "W4",
        "sqlite: µs/checkpoint @iter 10",
        "w4_checkpoint.sqlite",
        "ckpt_us_iter10",
        floors=(("packb", "w4_checkpoint.sqlite", "floor_packb_us_iter10"),),
        targets=_both("<=", 150),
        target_text="≤150",
        anchor="LangGraph +3,056 µs/iter (SqliteSaver)",
    ),
    Row(
        "W4",
        "sqlite: µs/checkpoint @iter 1,000",
        "w4_checkpoint.sqlite",
        "ckpt_us_late",
        floors=(("packb", "w4_checkpoint.sqlite", "floor_packb_us_late"),),
        targets=_both("<=", 150),
        target_text="≤150",
    ),
    Row(
        "W4",
        "sqlite: wall µs/checkpoint @iter 1,000 (waits for the GIL included)",
        "w4_checkpoint.sqlite",
        "ckpt_wall_us_late",
    ),
    Row(
        "W4",
        "sqlite: flatness 1,000 / 10",
        "w4_checkpoint.sqlite",
        "flatness",
        targets=_both("<=", 1.2),
        target_text="flat (≤1.2)",
    ),
    Row(
        "W4",
        "sqlite: bytes stored / transcript",
        "w4_checkpoint.sqlite",
        "bytes_vs_transcript",
        targets=_both("<=", 3),
        target_text="≤3",
    ),
    Row(
        "W4",
        "sqlite: fresh-process load() ms, 1,000 iters",
        "w4_checkpoint.sqlite",
        "fresh_load_ms",
        targets=_both("<=", 5),
        target_text="≤5",
        anchor="LangGraph 5.3 (+640 import)",
    ),
    Row(
        "W4",
        "sqlite: fresh-process load() + read every entry ms",
        "w4_checkpoint.sqlite",
        "fresh_load_read_all_ms",
    ),
    Row(
        "W4", "sqlite: fresh-process SqliteStore(path) ms", "w4_checkpoint.sqlite", "fresh_open_ms"
    ),
    Row("W4", "sqlite: fresh-process import ms", "w4_checkpoint.sqlite", "fresh_import_ms"),
    Row("W4", "sqlite: µs/iter (1,000 iters, 200 B)", "w4_checkpoint.sqlite", "us_per_iter"),
    Row("W5", "floor asyncio: wall s", "w5_concurrent.floor_asyncio", "wall_s", anchor="0.12"),
    Row(
        "W5",
        "floor asyncio: peak RSS MB",
        "w5_concurrent.floor_asyncio",
        "peak_rss_mb",
        anchor="25",
    ),
    Row("W5", "floor threads: wall s", "w5_concurrent.floor_threads", "wall_s", anchor="0.29"),
    Row(
        "W5",
        "floor threads: peak RSS MB",
        "w5_concurrent.floor_threads",
        "peak_rss_mb",
        anchor="28",
    ),
    Row("W5", "floor threads: peak threads", "w5_concurrent.floor_threads", "peak_threads"),
    Row(
        "W5",
        "1,000 runs: wall s",
        "w5_concurrent.steerable",
        "wall_s",
        floors=(
            ("asyncio", "w5_concurrent.floor_asyncio", "wall_s"),
            ("threads", "w5_concurrent.floor_threads", "wall_s"),
        ),
        targets=_both("<=", 1.0),
        target_text="≤1.0",
        anchor="pykka 2.5; teaching 2.1; LangGraph 8.7",
    ),
    Row(
        "W5",
        "1,000 runs: peak RSS MB",
        "w5_concurrent.steerable",
        "peak_rss_mb",
        floors=(("asyncio", "w5_concurrent.floor_asyncio", "peak_rss_mb"),),
        targets=_both("<=", 150),
        target_text="≤150",
        anchor="pykka 68; teaching 41; LangGraph 135",
    ),
    Row(
        "W5",
        "1,000 runs: peak threads",
        "w5_concurrent.steerable",
        "peak_threads",
        targets=_both("<=", 300),
        target_text="≤300",
    ),
    Row("W6", "floor: queue, tool end->seen ms", "w6_steering.floor", "queue_boundary_ms"),
    Row("W6", "floor: blocked get, put->seen ms", "w6_steering.floor", "interrupt_send_to_seen_ms"),
    Row(
        "W6",
        "queue: send->seen ms (tool 200 ms)",
        "w6_steering.steerable",
        "queue_send_to_seen_ms",
        floors=(("thread+queue", "w6_steering.floor", "queue_send_to_seen_ms"),),
        targets=_both("<=", 202),
        target_text="≤ tool+2 (202)",
    ),
    Row(
        "W6",
        "queue: tool end->seen ms",
        "w6_steering.steerable",
        "queue_boundary_ms",
        floors=(("thread+queue", "w6_steering.floor", "queue_boundary_ms"),),
        targets=_both("<=", 2),
        target_text="≤2",
    ),
    Row(
        "W6",
        "interrupt: send->seen ms",
        "w6_steering.steerable",
        "interrupt_send_to_seen_ms",
        floors=(("thread+queue", "w6_steering.floor", "interrupt_send_to_seen_ms"),),
        targets=_both("<=", 5),
        target_text="≤5",
    ),
    Row("W7", "floor: Event.wait lateness ms p50", "w7_timeout.floor", "lateness_ms"),
    Row("W7", "floor: Event.wait lateness ms p99", "w7_timeout.floor", "lateness_ms", stat="p99"),
    Row(
        "W7",
        "cooperative: lateness ms p50",
        "w7_timeout.cooperative",
        "lateness_ms",
        floors=(("Event.wait", "w7_timeout.floor", "lateness_ms"),),
    ),
    Row(
        "W7",
        "cooperative: lateness ms p99",
        "w7_timeout.cooperative",
        "lateness_ms",
        stat="p99",
        targets=_both("<=", 5),
        target_text="≤5",
    ),
    Row(
        "W7",
        "cooperative: starts of the 50 calls, first->last ms",
        "w7_timeout.cooperative",
        "dispatch_spread_ms",
    ),
    Row("W7", "sleep(10): lateness ms p50", "w7_timeout.noncooperative", "lateness_ms"),
    Row(
        "W7",
        "sleep(10): lateness ms p99",
        "w7_timeout.noncooperative",
        "lateness_ms",
        stat="p99",
        targets=_both("<=", 5),
        target_text="≤5",
    ),
    Row("W8", "floor asyncio: threads parked", "w8_parked.floor_asyncio", "parked_threads"),
    Row("W8", "floor asyncio: RSS MB parked", "w8_parked.floor_asyncio", "parked_rss_mb"),
    Row("W8", "floor asyncio: wake ms", "w8_parked.floor_asyncio", "wake_ms"),
    Row(
        "W8",
        "10,000 parked: threads",
        "w8_parked.steerable",
        "parked_threads",
        targets=_both("<=", 50),
        target_text="≤50",
    ),
    Row(
        "W8",
        "10,000 parked: RSS MB",
        "w8_parked.steerable",
        "parked_rss_mb",
        floors=(("asyncio", "w8_parked.floor_asyncio", "parked_rss_mb"),),
        targets=_both("<=", 400),
        target_text="≤400",
    ),
    Row(
        "W8",
        "wake: send->decide ms",
        "w8_parked.steerable",
        "wake_ms",
        floors=(("asyncio", "w8_parked.floor_asyncio", "wake_ms"),),
        targets=_both("<=", 10),
        target_text="≤10",
    ),
    Row(
        "W8",
        "time to park all (start->WAITING) s",
        "w8_parked.steerable",
        "park_all_s",
        floors=(("asyncio", "w8_parked.floor_asyncio", "park_all_s"),),
    ),
    Row("W9", "floor: sqlite INSERT+COMMIT msg/s", "w9_durable.floors", "sqlite_commit_per_msg"),
    Row("W9", "floor: queue.put msg/s", "w9_durable.floors", "queue_put"),
    Row(
        "W9",
        "sqlite: msg/s, 1 sender",
        "w9_durable.sqlite",
        "msgs_per_s_1_sender",
        floors=(("sqlite", "w9_durable.floors", "sqlite_commit_per_msg"),),
        targets=_both(">=", 5000),
        target_text="≥5,000",
    ),
    Row(
        "W9",
        "sqlite: msg/s, 4 senders",
        "w9_durable.sqlite",
        "msgs_per_s_4_senders",
        floors=(("sqlite", "w9_durable.floors", "sqlite_commit_per_msg"),),
        targets=_both(">=", 5000),
        target_text="≥5,000",
    ),
    Row(
        "W9",
        "memory: msg/s, 1 sender",
        "w9_durable.memory",
        "msgs_per_s_1_sender",
        floors=(("queue", "w9_durable.floors", "queue_put"),),
    ),
    Row(
        "W9",
        "memory: msg/s, 4 senders",
        "w9_durable.memory",
        "msgs_per_s_4_senders",
        floors=(("queue", "w9_durable.floors", "queue_put"),),
    ),
    Row(
        "W10",
        "floor: commit in B -> data_version in A, ms p50",
        "w10_steering.floor",
        "commit_to_notice_ms",
    ),
    Row(
        "W10",
        "rt.send in B -> agent's view in A, ms p50",
        "w10_steering.steerable",
        "send_to_view_ms",
        floors=(("commit", "w10_steering.floor", "commit_to_notice_ms"),),
        targets=_both("<=", 20),
        target_text="≤20",
    ),
    Row(
        "W10",
        "rt.send in B -> agent's view in A, ms p99",
        "w10_steering.steerable",
        "send_to_view_ms",
        stat="p99",
        targets=_both("<=", 100),
        target_text="≤100",
    ),
    Row(
        "W11",
        "floor: adoption pass interval (lease_ttl / 3), ms",
        "w11_takeover.steerable",
        "floor_pass_ms",
    ),
    Row(
        "W11",
        "SIGKILL owner -> adopter's checkpoint, ms p50 (lease_ttl 1 s)",
        "w11_takeover.steerable",
        "takeover_ms",
        floors=(("pass", "w11_takeover.steerable", "floor_pass_ms"),),
        targets=_both("<=", 2000),
        target_text="≤ TTL + 1 s",
    ),
    Row(
        "W11",
        "SIGKILL owner -> adopter's checkpoint, ms p99",
        "w11_takeover.steerable",
        "takeover_ms",
        stat="p99",
        targets=_both("<=", 2000),
        target_text="≤ TTL + 1 s",
    ),
    Row(
        "W9pg",
        "floor: pg INSERT+COMMIT msg/s, 1 thread",
        "w9_durable.floors_postgres",
        "pg_commit_per_msg",
    ),
    Row(
        "W9pg",
        "floor: pg INSERT+COMMIT msg/s, 4 threads",
        "w9_durable.floors_postgres",
        "pg_commit_per_msg_4",
    ),
    Row(
        "W9pg",
        "postgres: msg/s, 1 sender",
        "w9_durable.postgres",
        "msgs_per_s_1_sender",
        floors=(("pg", "w9_durable.floors_postgres", "pg_commit_per_msg"),),
    ),
    Row(
        "W9pg",
        "postgres: msg/s, 4 senders",
        "w9_durable.postgres",
        "msgs_per_s_4_senders",
        floors=(("pg4", "w9_durable.floors_postgres", "pg_commit_per_msg_4"),),
        targets=_both(">=", 2000),
        target_text="≥2,000 and ≥0.3x the floor (ratio ≤3.33)",
        ratio_max=1 / 0.3,
    ),
    Row(
        "W4pg",
        "postgres: µs/checkpoint @iter 10",
        "w4_checkpoint.postgres",
        "ckpt_us_iter10",
        floors=(("packb", "w4_checkpoint.postgres", "floor_packb_us_iter10"),),
        targets=_both("<=", 500),
        target_text="≤500",
    ),
    Row(
        "W4pg",
        "postgres: µs/checkpoint @iter 1,000",
        "w4_checkpoint.postgres",
        "ckpt_us_late",
        floors=(("packb", "w4_checkpoint.postgres", "floor_packb_us_late"),),
        targets=_both("<=", 500),
        target_text="≤500",
    ),
    Row(
        "W4pg",
        "postgres: flatness 1,000 / 10",
        "w4_checkpoint.postgres",
        "flatness",
        targets=_both("<=", 1.2),
        target_text="flat (≤1.2)",
    ),
    Row("W4pg", "postgres: µs/iter (1,000 iters, 200 B)", "w4_checkpoint.postgres", "us_per_iter"),
    Row(
        "W10pg",
        "floor: commit+NOTIFY in B -> LISTEN in A, ms p50",
        "w10_postgres.floor",
        "commit_to_notice_ms",
    ),
    Row(
        "W10pg",
        "rt.send in B -> agent's view in A, ms p50",
        "w10_postgres.steerable",
        "send_to_view_ms",
        floors=(("notify", "w10_postgres.floor", "commit_to_notice_ms"),),
        targets=_both("<=", 10),
        target_text="≤10",
    ),
    Row(
        "W10pg",
        "rt.send in B -> agent's view in A, ms p99",
        "w10_postgres.steerable",
        "send_to_view_ms",
        stat="p99",
        targets=_both("<=", 100),
        target_text="≤100",
    ),
    Row(
        "W10pg",
        "A's listener killed before each: send -> view, ms max",
        "w10_postgres.listener_killed",
        "send_to_view_ms",
        stat="max",
        targets=_both("<=", 350),
        target_text="≤ poll 250 + 100",
    ),
    Row(
        "W11pg",
        "SIGKILL owner -> adopted, ms p50 (lease_ttl 1 s)",
        "w10_postgres.takeover",
        "takeover_ms",
        targets=_both("<=", 2000),
        target_text="≤ TTL + 1 s",
    ),
    Row(
        "W11pg",
        "SIGKILL owner -> adopted, ms max",
        "w10_postgres.takeover",
        "takeover_ms",
        stat="max",
        targets=_both("<=", 2000),
        target_text="≤ TTL + 1 s",
    ),
    Row(
        "W12",
        "floor: idle loop, 5 ms tick lateness ms p99",
        "w12_loop_lag.steerable",
        "floor_lateness_ms",
        stat="p99",
    ),
    Row(
        "W12",
        "20 runs via the async face: tick lateness ms p99",
        "w12_loop_lag.steerable",
        "lateness_ms",
        stat="p99",
    ),
    Row(
        "W12",
        "20 runs: p99 lateness over the floor, ms",
        "w12_loop_lag.steerable",
        "excess_p99_ms",
        targets=_both("<=", 2),
        target_text="≤2 over floor",
    ),
    Row(
        "W12",
        "20 runs: max lateness over the floor, ms",
        "w12_loop_lag.steerable",
        "excess_max_ms",
        targets=_both("<=", 5),
        target_text="≤5 over floor",
    ),
    Row(
        "W12",
        "host option gc.freeze(): p99 over the floor, ms",
        "w12_loop_lag.frozen",
        "excess_p99_ms",
    ),
    Row(
        "W12",
        "host option gc.freeze(): max over the floor, ms",
        "w12_loop_lag.frozen",
        "excess_max_ms",
    ),
    Row(
        "W12",
        "host option Runtime.tune_gc(): p99 over the floor, ms",
        "w12_loop_lag.tuned",
        "excess_p99_ms",
    ),
    Row(
        "W12",
        "host option Runtime.tune_gc(): max over the floor, ms",
        "w12_loop_lag.tuned",
        "excess_max_ms",
    ),
    Row(
        "W13",
        "no provider: µs/iter, 200 iters",
        "w13_tracing.overhead",
        "us_per_iter_none",
        floors=(("W1", "w1_loop.memory", "us_per_iter_200"),),
        target_text="W1 within noise",
    ),
    Row("W13", "no-op provider: µs/iter", "w13_tracing.overhead", "us_per_iter_noop"),
    Row(
        "W13",
        "no-op provider: % over none",
        "w13_tracing.overhead",
        "overhead_noop_pct",
        targets=_both("<=", 5),
        target_text="≤5%",
    ),
    Row("W13", "SDK, in-memory exporter: µs/iter", "w13_tracing.overhead", "us_per_iter_sdk"),
    Row("W13", "SDK: % over none", "w13_tracing.overhead", "overhead_sdk_pct"),
    Row(
        "W13",
        "SDK: µs/iter until every span exported",
        "w13_tracing.overhead",
        "us_per_iter_sdk_exported",
    ),
]


# ---------------------------------------------------------------------------- computing


def _metric(results: dict[str, Any], case: str, metric: str, pin: str) -> dict[str, Any] | None:
    """The metric dict of a case for one pinning, or None if absent."""
    entry = results.get(case, {}).get(pin)
    if not entry or not entry.get("ok"):
        return None
    found: dict[str, Any] | None = entry["result"].get("metrics", {}).get(metric)
    return found


def _value(m: dict[str, Any], stat: str) -> float:
    samples = m["samples"]
    if stat == "all":
        return float(min(samples))
    if stat == "max":
        return float(max(samples))
    s = summarise(samples)
    return float(s["p99"] if stat == "p99" else s["median"])


def _status(results: dict[str, Any], case: str, pin: str) -> str | None:
    entry = results.get(case, {}).get(pin)
    if entry is None:
        return "not run"
    if not entry.get("ok"):
        return "FAILED"
    if "unavailable" in entry["result"]:
        return "not available"
    return None


def build_rows(results: dict[str, Any], pins: list[str]) -> list[dict[str, Any]]:
    """Every row with its figures, floors, ratios and verdicts, per pinning."""
    out = []
    for row in ROWS:
        rec: dict[str, Any] = {
            "workload": row.wid,
            "figure": row.label,
            "case": row.case,
            "metric": row.metric,
            "stat": row.stat,
            "target": row.target_text,
            "anchor": row.anchor,
        }
        if row.note:
            rec["note"] = row.note
            out.append(rec)
            continue
        for pin in pins:
            fig: dict[str, Any] = {}
            status = _status(results, row.case, pin)
            m = _metric(results, row.case, row.metric, pin)
            if status is not None or m is None:
                fig["status"] = status or "-"
                rec[pin] = fig
                continue
            fig.update(summarise(m["samples"]))
            fig["unit"] = m["unit"]
            fig["value"] = _value(m, row.stat)
            ratios = {}
            for name, fcase, fmetric in row.floors:
                fm = _metric(results, fcase, fmetric, pin)
                if fm is None:
                    continue
                floor = _value(fm, "median")
                if m.get("better") == "higher":
                    ratios[name] = floor / fig["value"] if fig["value"] else float("inf")
                else:
                    ratios[name] = fig["value"] / floor if floor else float("inf")
                fig.setdefault("floors", {})[name] = floor
            if ratios:
                fig["ratios"] = ratios
            target = row.targets.get(pin)
            if target is not None:
                op, bound = target
                fig["met"] = fig["value"] <= bound if op == "<=" else fig["value"] >= bound
                if row.ratio_max is not None:
                    fig["met"] = fig["met"] and all(r <= row.ratio_max for r in ratios.values())
            rec[pin] = fig
        out.append(rec)
    return out


# ---------------------------------------------------------------------------- rendering


def fmt(v: float) -> str:
    """A compact number."""
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def _cell(fig: dict[str, Any] | None, stat: str) -> str:
    if fig is None:
        return ""
    if "status" in fig:
        return str(fig["status"])
    if fig["unit"] == "yes/no":
        return f"yes ({fig['n']}/{fig['n']})" if fig["min"] >= 1 else f"NO (in some of {fig['n']})"
    if fig["n"] == 1:
        return fmt(fig["value"])
    if stat == "p99":
        return f"{fmt(fig['value'])} (n={fig['n']})"
    return f"{fmt(fig['value'])} ({fmt(fig['min'])}-{fmt(fig['max'])})"


def _ratio(fig: dict[str, Any] | None) -> str:
    if not fig or "ratios" not in fig:
        return ""
    return ", ".join(f"{fmt(r)}x {name}" for name, r in fig["ratios"].items())


def _met(rec: dict[str, Any], pins: list[str]) -> str:
    parts = []
    for pin in pins:
        fig = rec.get(pin)
        if fig and "met" in fig:
            parts.append(f"{pin}:{'yes' if fig['met'] else 'NO'}")
    return " ".join(parts)


def _table(rows: list[dict[str, Any]], pins: list[str], anchors: bool) -> list[list[str]]:
    head = ["id", "figure"]
    head += ["unpinned med (min-max)" if p == "U" else "pinned med (min-max)" for p in pins]
    head += ["ratio to floor (U)"]
    if "P" in pins:
        head += ["ratio (P)"]
    head += ["target", "met"]
    if anchors:
        head += ["anchors (docs/benchmarks.md)"]
    table = [head]
    for rec in rows:
        if "note" in rec:
            line = [rec["workload"], rec["figure"]] + [rec["note"]] * len(pins)
            line += [""] * (2 if "P" in pins else 1) + [rec["target"], ""]
        else:
            line = [rec["workload"], rec["figure"]]
            line += [_cell(rec.get(p), rec["stat"]) for p in pins]
            line += [_ratio(rec.get("U"))]
            if "P" in pins:
                line += [_ratio(rec.get("P"))]
            line += [rec["target"], _met(rec, pins)]
        if anchors:
            line += [rec["anchor"]]
        table.append(line)
    return table


def render_text(rows: list[dict[str, Any]], pins: list[str]) -> str:
    """A fixed-width table for the terminal."""
    table = _table(rows, pins, anchors=False)
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    lines = []
    for k, r in enumerate(table):
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render_markdown(rows: list[dict[str, Any]], pins: list[str]) -> str:
    """A markdown table with the anchors column, for docs/performance.md."""
    table = _table(rows, pins, anchors=True)
    lines = ["| " + " | ".join(table[0]) + " |", "|" + "---|" * len(table[0])]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in r) + " |" for r in table[1:]]
    return "\n".join(lines)
