#!/usr/bin/env bash
# Set up, then run the main job: an MPMD program over 8 simulated devices, with a per-device summary.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/python -m pw_kernel.demo "$@"
