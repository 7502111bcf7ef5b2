"""The Pathways core's decisions, with no threads, locks or devices: what a run is and what happens next.

It owns the run lifecycle (`lifecycle.py`: one transition table keyed by (state,
event), pure handlers that update a run's record and return effects, a work
list for cascades, validation of the invariants), the records and effects
those transitions exchange (`records.py`), plans (`plan.py`: a program graph
turned into immutable steps over value slots, with peak memory per device)
and the scheduling policies that pick the next run (`scheduler.py`).
"""
