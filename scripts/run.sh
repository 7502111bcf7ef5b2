#!/usr/bin/env bash
# Set up, install the "Python 3 (Pathways)" Jupyter kernel, then open the tutorial notebooks in JupyterLab.
#
#   ./scripts/run.sh [ARGS...]          JupyterLab on your own copies of the tutorials, in workspace/
#                                       (ARGS go to `jupyter lab`, e.g. --no-browser)
#   ./scripts/run.sh --headless [NB...] execute every notebook (or NB...) in the Pathways kernel; write the
#                                       executed notebooks and their HTML (widget state saved) to artifacts/notebooks/
#   ./scripts/run.sh --demo [ARGS...]   the headless demo: an MPMD program over 8 simulated devices
#
# The tutorials take their layouts from the devices present: an accelerator if JAX finds one, else
# 8 simulated CPU devices (`PW_NUM_CPU_DEVICES=1 ./scripts/run.sh` is what a one-GPU host sees).
# `JAX_PLATFORMS=cpu ./scripts/run.sh` keeps them on the CPU where there is an accelerator.
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

# The kernel in this environment (always on its Jupyter's path; skipped where the environment is not
# this user's to write, a shared one) and for this user (other Jupyters).
if [ -w .venv ]; then
    .venv/bin/python -m pw_kernel install --sys-prefix >/dev/null
fi
.venv/bin/python -m pw_kernel install --user

if [ "$mode" = headless ]; then
    exec .venv/bin/python scripts/run_notebooks.py "$@"
fi

extra=()
if [ "$(id -u)" -eq 0 ]; then
    extra+=(--allow-root)  # JupyterLab refuses to run as root without it (containers, CI machines)
fi
# You work in copies (PW_WORKSPACE, default workspace/, ignored by git): the tracked tutorials in
# notebooks/ stay clean however you run and save them. A copy you have is kept;
# `rm workspace/NAME.ipynb` brings back the original at the next start.
ws="${PW_WORKSPACE:-workspace}"
mkdir -p "$ws"
for f in notebooks/*.ipynb notebooks/README.md; do
    [ -e "$ws/$(basename "$f")" ] || cp "$f" "$ws/"
done
echo "[run] tutorials: your copies in $ws/ (the originals stay in notebooks/)"
# The folder goes as an option, not a positional argument: `jupyter lab NAME` reads NAME as a
# subcommand when it is one (`workspace` is: `jupyter lab workspace` exports or imports layouts).
exec .venv/bin/jupyter lab --ServerApp.root_dir="$(cd "$ws" && pwd)" \
    --MappingKernelManager.default_kernel_name=pathways "${extra[@]}" "$@"
