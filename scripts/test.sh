#!/usr/bin/env bash
# Set up, then run the whole test suite. Fails if pytest collected no tests.
#
#   ./scripts/test.sh [PYTEST ARGS...]           everything (what CI runs)
#   ./scripts/test.sh --quick [PYTEST ARGS...]   the contributor's tier: the runtime, the notebook front and
#                                                the views, in-process tests only (no kernels, browsers, Ray,
#                                                service processes or tutorials: tests/conftest.py SYSTEM),
#                                                spread over two pytest workers (pytest-xdist)
set -uo pipefail
cd "$(dirname "$0")/.."
tier=()
if [ "${1:-}" = "--quick" ]; then
    shift
    # Two workers: the unit tier is hundreds of small tests, ~1.4x quicker on two cores this way. The whole
    # suite stays in one process: its kernels, browsers and Ray clusters already keep ~70% of two cores busy,
    # and over two workers (a module, a tutorial, or everything that starts Ray a unit) it took 37 minutes
    # against 42 and failed five tests that pass alone (Ray's start-up timing out, a kernel never idle).
    tier=(-m "not system" -n 2)
fi
./scripts/setup.sh notebook,test || exit 1
# The "Python 3 (Pathways)" kernel in this environment, as run.sh installs it (tests start it by name).
.venv/bin/python -m pw_kernel install --sys-prefix >/dev/null || exit 1
.venv/bin/python -m pytest "${tier[@]}" "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: treating that as a failure" >&2
    exit 1
fi
exit "$rc"
