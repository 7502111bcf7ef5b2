"""The pipeline view: a timeline of pipelined steps with each one's per-slice bubble and live activations beside it.

It consumes `PipelineStats` (the runtime's data object) and their runs' events;
the stats never draw themselves.

Example::

    runs = [p.submit_step(state[k], x, y, mode="chained") for k, p in pipes.items()]
    pw.show_pipeline([p.stats(r.wait()) for p, r in zip(pipes.values(), runs)])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._html import esc, fmt_bytes, fmt_ns, page


def stats_html(stats: Sequence[Any]) -> str:
    """One table: a row per schedule and slice, measured next to the ideal-device replay and the paper's bubble."""
    head = (
        "<tr><th>step</th><th>slice</th><th>stages</th><th>bubble measured</th><th>bubble ideal</th>"
        "<th>bubble theory</th><th>live measured</th><th>live ideal</th><th>live activations</th>"
        "<th>memory estimate</th></tr>"
    )
    rows = []
    for st in stats:
        name = st.run.name if st.run is not None else st.pipeline
        desc = f"{st.schedule}, M={st.microbatches}" + (f", v={st.chunks}" if st.chunks > 1 else "")
        desc += "" if st.remat else ", no remat"
        for k, s in enumerate(st.slices):
            first = (
                f'<td rowspan="{len(st.slices)}"><b>{esc(name)}</b><br><span style="color:#666">{esc(desc)}</span><br>'
                f"span {fmt_ns(st.span_ns)}</td>"
                if k == 0
                else ""
            )
            theory = f'<td rowspan="{len(st.slices)}">{st.theory:.3f}</td>' if k == 0 else ""
            rows.append(
                f"<tr>{first}<td>{esc(s.slice)}</td><td>{', '.join(map(str, s.stages))}</td>"
                f"<td>{s.bubble:.3f}</td><td>{s.ideal_bubble:.3f}</td>{theory}<td>{s.live}</td><td>{s.ideal_live}</td>"
                f"<td>{fmt_bytes(s.live_bytes)}</td><td>{fmt_bytes(s.reserved_bytes)}</td></tr>"
            )
    style = (
        "<style>.pw-pipe td,.pw-pipe th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right;"
        "vertical-align:top}.pw-pipe th{background:#f4f4f4}</style>"
    )
    note = (
        '<div style="color:#666;margin-top:4px">bubble: the fraction of the step a slice idles; ideal: the same '
        "ops on devices that all run at once (forward 1, backward 2 per chunk); live: the most microbatches a "
        "slice holds for their backward; memory estimate: what the run reserved per device.</div>"
    )
    return page(f'{style}<table class="pw-pipe" style="border-collapse:collapse">{head}{"".join(rows)}</table>{note}', "pw-pipeline")


def show_pipeline(stats: Any, title: str | None = None, **timeline_kwargs: Any) -> Any:
    """A timeline per step (each schedule fills the width on its own lanes) with the per-slice table beside them.

    Steps that ran one after another would share one time axis, each a third of it with bars a few
    pixels wide; here each step's timeline spans the width (compare their spans in the table and in
    each title). Its mimebundle also carries a static picture, for viewers without widgets.

    Example::

        pw.show_pipeline([pipe.stats(run) for run in runs])
    """
    import ipywidgets

    from .timeline_widget import TimelineWidget

    class PipelineView(ipywidgets.Box):
        def _repr_mimebundle_(self, **kwargs: Any):
            out = super()._repr_mimebundle_(**kwargs)
            timelines, table = self.children[0].children, self.children[1]
            static = "".join(t.static_html() for t in timelines) + table.value
            if out is None:
                return {"text/plain": repr(self), "text/html": static}
            data, metadata = out if isinstance(out, tuple) else (out, {})
            return {**data, "text/html": static}, metadata

    stats = list(stats) if isinstance(stats, (list, tuple)) else [stats]
    timelines = []
    for st in stats:
        name = st.run.name if st.run is not None else st.pipeline
        label = f"{title} · {name}" if title else f"{name}: {st.schedule}, span {fmt_ns(st.span_ns)}"
        if st.run is not None:
            timelines.append(TimelineWidget([st.run], live=False, title=label, **timeline_kwargs))
        else:
            timelines.append(TimelineWidget(live=False, events=[], title=label, **timeline_kwargs))
    table = ipywidgets.HTML(stats_html(stats))
    column = ipywidgets.VBox(timelines, layout=ipywidgets.Layout(flex="1 1 640px", min_width="480px"))
    return PipelineView(
        [column, table],
        layout=ipywidgets.Layout(display="flex", flex_flow="row wrap", align_items="flex-start", gap="12px"),
    )


__all__ = ["show_pipeline", "stats_html"]
