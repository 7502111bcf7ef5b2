"""What `Controller.status()` returns: islands, live slices and a summary of each run kept."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from ..core.records import FINAL
from ..devices import Island, VirtualSlice
from ..run import describe_state, pace


class RunSummary(NamedTuple):
    """One run in a `Status`: id, name, state and progress."""

    id: int
    name: str
    state: str
    done: int
    total: int
    compile_s: float = 0.0  # compiling its executables (a program's first call)
    on_devices: int = 0  # nodes dispatched and not finished (a cancelled run's still run)
    throughput: float | None = None  # nodes finished per second (`Run.throughput`)
    time_left: float | None = None  # seconds, estimated (`Run.time_left`)

    @property
    def pace(self) -> str:
        """For a run that has run a while: '85 nodes/s, ~12 s left'; else ''."""
        return pace(self.state, self.throughput, self.time_left, self.done, self.total)

    @property
    def state_text(self) -> str:
        """The state, or 'cancelling: 2 nodes on the devices' while a cancelled run's nodes finish."""
        return describe_state(self.state, self.on_devices)


@dataclasses.dataclass(frozen=True)
class Status:
    """A snapshot of the controller: islands, live slices, runs by state."""

    islands: tuple[Island, ...]
    slices: tuple[VirtualSlice, ...]
    runs: tuple[RunSummary, ...]
    inflight: dict[int, int]
    policy: str

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.runs:
            out[r.state] = out.get(r.state, 0) + 1
        return out

    def recent_runs(self, recent: int = 10) -> tuple[list[RunSummary], int]:
        """The runs worth listing: every one not yet final and the last ``recent``; and how many are left out.

        Example::

            shown, hidden = pw.controller().status().recent_runs()
        """
        last = {r.id for r in self.runs[-recent:]} if recent > 0 else set()
        shown = [r for r in self.runs if r.id in last or r.state not in FINAL]
        return shown, len(self.runs) - len(shown)

    def __str__(self) -> str:
        lines = [f"pw_kernel controller: {len(self.islands)} islands, policy {self.policy}"]
        for i in self.islands:
            lines.append(f"  {i!r}  in flight: {self.inflight.get(i.id, 0)}")
        lines.append(f"slices ({len(self.slices)}):")
        for s in self.slices:
            lines.append(f"  {s!r}")
        counts = ", ".join(f"{v} {k}" for k, v in sorted(self.counts().items())) or "none"
        lines.append(f"runs: {counts}")
        shown, hidden = self.recent_runs()
        for r in shown:
            compiled = f"  compiled in {r.compile_s * 1e3:.0f} ms" if r.compile_s else ""
            pace = r.pace
            pace = f"  {pace}" if pace else ""
            lines.append(f"  run {r.id:4d} {r.name:24s} {r.state_text:9s} {r.done}/{r.total}{compiled}{pace}")
        if hidden:
            lines.append(f"  ... and {hidden} earlier finished runs (`pw.controller().runs` has them all)")
        return "\n".join(lines)


__all__ = ["RunSummary", "Status"]
