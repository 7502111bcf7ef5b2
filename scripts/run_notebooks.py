"""Execute the tutorial notebooks in the "Python 3 (Pathways)" kernel and write them as HTML with widget state.

    .venv/bin/python scripts/run_notebooks.py [NOTEBOOK ...] [--out artifacts/notebooks] [--timeout 600]
    .venv/bin/python scripts/run_notebooks.py --clear [NOTEBOOK ...]    # strip outputs in place, before committing

Each notebook runs top to bottom with nbclient (any error fails it); the executed
notebook (.ipynb) and its HTML go to ``--out``. Widget state is saved, so the
HTML draws the widgets with their JavaScript front-ends (loaded by the Jupyter
widgets HTML manager from its CDN); where those cannot load (offline), each
widget's static HTML rendering shows instead. Exits non-zero if any notebook
failed, or a cell ran longer than ``--timeout`` seconds (a hang guard: a loaded machine
is slower, not wrong). Each notebook's time is printed.

Needs the kernelspec: ``.venv/bin/python -m pw_kernel install --user`` (run.sh does it).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import jinja2
import nbclient
import nbformat
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
from nbconvert import HTMLExporter

ROOT = Path(__file__).resolve().parent.parent
KERNEL = "pathways"

# Appended while executing, removed before saving: waits for runs still in flight, then has every widget send
# its full state once more and re-publish its static HTML, so what is saved is each widget's final state
# (nbclient keeps only the widget messages that arrive while some cell executes).
SYNC_WIDGETS = """\
import time as _pw_time
import pw_kernel as _pw
_pw_c = _pw.controller(create=False)
if _pw_c is not None:
    _pw_c.wait_all(timeout=60)
_pw_time.sleep(0.5)
try:
    from ipywidgets.widgets.widget import _instances as _pw_widgets
except ImportError:
    _pw_widgets = {}
for _pw_w in list(_pw_widgets.values()):
    if _pw_w.comm is not None:
        _pw_w.send_state()
        if hasattr(_pw_w, "refresh_static"):
            _pw_w.refresh_static()
"""

# The lab template's widget view, plus the widget's static HTML inside it; CSS hides that once the view rendered.
TEMPLATE = """\
{%- extends 'index.html.j2' -%}
{%- block extra_css -%}
{{ super() }}
<style>.jupyter-widgets:has(.widget-subarea > *) > .pw-static-fallback { display: none; }</style>
{%- endblock extra_css -%}
{%- block data_widget_view scoped %}
{% set div_id = uuid4() %}
{% set datatype = (output.data | filter_data_type)[0] %}
<div id="{{ div_id }}" class="jupyter-widgets jp-OutputArea-output {{ extra_class }}">
<script type="text/javascript">
var element = document.getElementById('{{ div_id }}');
</script>
<script type="{{ datatype }}">
{{ output.data[datatype] | json_dumps | escape_html_script }}
</script>
{%- if 'text/html' in output.data %}
<div class="pw-static-fallback">{{ output.data['text/html'] }}</div>
{%- endif %}
</div>
{%- endblock data_widget_view -%}
"""


def execute(path: Path, timeout: float) -> tuple[nbformat.NotebookNode, BaseException | None, float]:
    """Run ``path`` in the Pathways kernel; returns the executed notebook, the error (if any) and seconds taken."""
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(SYNC_WIDGETS))
    # Local sockets rather than TCP on localhost: nothing to encrypt, and no warning about it per notebook.
    km = KernelManager(kernel_name=KERNEL, transport="ipc", ip=str(Path(tempfile.mkdtemp(prefix="pw-kernel-")) / "k"))
    client = nbclient.NotebookClient(
        nb,
        km=km,
        kernel_name=KERNEL,
        timeout=timeout,
        startup_timeout=90,
        # (nbclient's default: a cell's outputs that trail its reply by 4 s are dropped, silently, on a busy machine)
        iopub_timeout=120,
        raise_on_iopub_timeout=True,
        store_widget_state=True,
        resources={"metadata": {"path": str(path.parent)}},
    )
    error = None
    start = time.perf_counter()
    try:
        client.execute()
    except Exception as e:  # CellExecutionError, DeadKernelError, CellTimeoutError, NoSuchKernel
        error = e
    finally:
        if km.has_kernel:  # a kernel manager we made is ours to stop
            km.shutdown_kernel(now=True)
    seconds = time.perf_counter() - start
    if nb.cells and nb.cells[-1].source == SYNC_WIDGETS:
        nb.cells.pop()
    return nb, error, seconds


def to_html(nb: nbformat.NotebookNode) -> str:
    exporter = HTMLExporter(
        template_name="lab",
        extra_loaders=[jinja2.DictLoader({"pw_notebook.html.j2": TEMPLATE})],
        template_file="pw_notebook.html.j2",
    )
    body, _ = exporter.from_notebook_node(nb)
    return body


def clear(path: Path) -> None:
    """Remove outputs, execution counts, saved widget state and execution timings from ``path``, in place."""
    nb = nbformat.read(path, as_version=4)
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    nbformat.write(nb, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/*.ipynb")
    ap.add_argument("--out", type=Path, default=ROOT / "artifacts" / "notebooks")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds a cell may run (a hang guard)")
    ap.add_argument("--clear", action="store_true", help="strip outputs from the notebooks in place; run nothing")
    args = ap.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb"))
    if args.clear:
        for path in paths:
            clear(path)
            print(f"[notebooks] cleared {path}")
        return 0
    try:
        KernelSpecManager().get_kernel_spec(KERNEL)
    except NoSuchKernel:
        print(
            f"[notebooks] no Jupyter kernel named {KERNEL!r}. Install it first: "
            f"{sys.executable} -m pw_kernel install --user",
            file=sys.stderr,
        )
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    failed = []
    for path in paths:
        path = path.resolve()
        print(f"[notebooks] {path.name} ...", flush=True)
        nb, error, seconds = execute(path, args.timeout)
        ipynb = args.out / path.name
        html = args.out / (path.stem + ".html")
        nbformat.write(nb, ipynb)
        html.write_text(to_html(nb), encoding="utf-8")
        status = "ok" if error is None else "FAILED"
        print(f"[notebooks] {path.name}: {status} in {seconds:.1f} s -> {html}", flush=True)
        if error is not None:
            print(str(error)[-3000:], file=sys.stderr, flush=True)
            failed.append(path.name)
    print(f"[notebooks] HTML and executed notebooks in {args.out}")
    if failed:
        print(f"[notebooks] failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
