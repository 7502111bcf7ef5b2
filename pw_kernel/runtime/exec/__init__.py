"""Execution: the controller and the threads that carry its decisions out on the devices.

It owns the `Controller` (the lock, and the one place the lifecycle's effects
are applied: futures set, run events emitted, the dispatcher woken), the
`Port` through which everything below it reports upward (`port.py`), plans
(`plan.py`: a program graph lowered to steps over value slots, the executables
they call and what running them teaches, peak memory per device), the
dispatcher (asks for work, calls executables, reports what it sent), completion
(the watcher thread, or a waiting caller, that blocks on results in dispatch
order and reports what finished), Ctrl-C deferral around dispatch, and the
event log with its subscribers and Chrome-trace export.
"""
