#!/usr/bin/env bash
# Set up, install the "Python 3 (Pathways)" Jupyter kernel, then open the tutorial notebooks in JupyterLab.
#
#   ./scripts/run.sh [ARGS...]          JupyterLab on notebooks/ (ARGS go to `jupyter lab`, e.g. --no-browser)
#   ./scripts/run.sh --headless [NB...] execute every notebook (or NB...) in the Pathways kernel; write the
#                                       executed notebooks and their HTML (widget state saved) to artifacts/notebooks/
#   ./scripts/run.sh --demo [ARGS...]   the headless demo: an MPMD program over 8 simulated devices
#
# The notebooks are written for 8 simulated CPU devices, so JAX_PLATFORMS defaults to cpu here;
# `JAX_PLATFORMS= ./scripts/run.sh` lets JAX pick your accelerators instead.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh

mode=lab
case "${1:-}" in
    --headless) mode=headless; shift ;;
    --demo) mode=demo; shift ;;
esac

if [ "$mode" = demo ]; then
    exec .venv/bin/python -m pw_kernel.demo "$@"
fi

export JAX_PLATFORMS="${JAX_PLATFORMS-cpu}"
.venv/bin/python -m pw_kernel install --user

if [ "$mode" = headless ]; then
    exec .venv/bin/python scripts/run_notebooks.py "$@"
fi

extra=()
if [ "$(id -u)" -eq 0 ]; then
    extra+=(--allow-root)  # JupyterLab refuses to run as root without it (containers, CI machines)
fi
exec .venv/bin/jupyter lab notebooks/ "${extra[@]}" "$@"
