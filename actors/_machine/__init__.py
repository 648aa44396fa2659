"""The pure run machine: a run's state and policy, with no threads, no clock and no I/O.

It imports only `steerable.protocol` and itself (tests/test_layers.py holds it to that); it acts
on the world through the `Effects` port the host side implements.
"""
