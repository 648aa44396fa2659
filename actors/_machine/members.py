"""Enum members the run machine reads on every step, as module constants.

On Python 3.11 a read such as `Stage.IDLE` goes through the enum metaclass's `__getattr__`
hook, about 85 ns more than a module global (docs/performance.md, "Wave 4: session 19"):
some 40 reads a W1 iteration. Python 3.12 dropped the hook.
"""

from __future__ import annotations

from steerable.protocol import CallStatus, EventKind, Phase, RunState

from .effects import TimerKind
from .stage import Stage

KIND_EXECUTE_FINISHED = EventKind.EXECUTE_FINISHED
KIND_EXECUTE_STARTED = EventKind.EXECUTE_STARTED
KIND_PLANNING_FINISHED = EventKind.PLANNING_FINISHED
KIND_PLANNING_STARTED = EventKind.PLANNING_STARTED
KIND_REASONING_FINISHED = EventKind.REASONING_FINISHED
KIND_REASONING_STARTED = EventKind.REASONING_STARTED
KIND_TOOL_FINISHED = EventKind.TOOL_FINISHED
KIND_TOOL_STARTED = EventKind.TOOL_STARTED
PHASE_EXECUTE = Phase.EXECUTE
PHASE_PLAN = Phase.PLAN
PHASE_REASON = Phase.REASON
STAGE_CANCELLING = Stage.CANCELLING
STAGE_DONE = Stage.DONE
STAGE_EXECUTING = Stage.EXECUTING
STAGE_IDLE = Stage.IDLE
STAGE_REASONING = Stage.REASONING
STATE_WAITING = RunState.WAITING
STATUS_AWAITING_APPROVAL = CallStatus.AWAITING_APPROVAL
STATUS_PENDING = CallStatus.PENDING
STATUS_RUNNING = CallStatus.RUNNING
TIMER_MODEL_TIMEOUT = TimerKind.MODEL_TIMEOUT
TIMER_TOOL_RETRY = TimerKind.TOOL_RETRY
TIMER_TOOL_TIMEOUT = TimerKind.TOOL_TIMEOUT
