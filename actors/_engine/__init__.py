"""The thread and pykka engine: dispatcher, worker pool, timer, asyncio runner, clock, scopes.

It knows nothing of runs: it moves jobs and messages between threads.
"""
