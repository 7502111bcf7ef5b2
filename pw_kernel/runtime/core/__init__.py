"""The Pathways core's decisions, with no threads, locks or devices: what a run is and what happens next.

It owns the run lifecycle (`lifecycle.py`: one transition table keyed by (state,
event), pure handlers that update a run's record and return effects, a work
list for cascades, validation of the invariants), the records and effects
those transitions exchange (`records.py`), the transition log that answers a
run's story (`story.py`), the scheduling policies that pick the next run
(`scheduler.py`) and the run-ahead gate that, with the lifecycle's credit,
decides whether a step may go to its devices now (`runahead.py`: estimates
learnt from measured node times, no locks: one writer per counter). Plans, which hold the executables, are execution's (`exec/plan.py`).
"""
