#!/usr/bin/env bash
# Set up, then run the whole test suite. Fails if pytest collected no tests.
#
#   ./scripts/test.sh [PYTEST ARGS...]           everything (what CI runs): the unit tier and the in-process
#                                                model tests over two pytest workers, then the system tier
#                                                (tests/conftest.py SYSTEM) in one process
#   ./scripts/test.sh --quick [PYTEST ARGS...]   the contributor's tier: the runtime, the notebook front and
#                                                the views, in-process tests only (no kernels, browsers, Ray,
#                                                service processes or tutorials: tests/conftest.py SYSTEM; no
#                                                model training: MODELS),
#                                                spread over two pytest workers (pytest-xdist)
set -uo pipefail
cd "$(dirname "$0")/.."
quick=0
if [ "${1:-}" = "--quick" ]; then
    shift
    quick=1
fi
./scripts/setup.sh notebook,test || exit 1
# The "Python 3 (Pathways)" kernel in this environment, as run.sh installs it (tests start it by name).
.venv/bin/python -m pw_kernel install --sys-prefix >/dev/null || exit 1

# pytest's own exit codes: 0 passed, 5 collected nothing (a filter that left this tier empty).
ran=0
failed=0
tier() {
    .venv/bin/python -m pytest "$@"
    local rc=$?
    case "$rc" in
        0) ran=1 ;;
        5) ;;
        *) ran=1; failed=$rc ;;
    esac
}
# The unit tier: hundreds of small in-process tests, ~2.5x quicker over two workers on two cores (the whole
# suite adds the in-process tests that train models: tests/conftest.py MODELS).
if [ "$quick" -eq 1 ]; then
    tier -m "not system and not models" -n 2 "$@"
else
    tier -m "not system" -n 2 "$@"
    # The system tier stays in one process: its kernels, browsers and Ray clusters already keep ~70% of two
    # cores busy, and over two workers (a module, a tutorial, or everything that starts Ray a unit) it took
    # 37 minutes against 42 and failed five tests that pass alone (Ray's start-up timing out, a kernel never
    # idle).
    tier -m system "$@"
fi
if [ "$ran" -eq 0 ]; then
    echo "pytest collected no tests: treating that as a failure" >&2
    exit 1
fi
exit "$failed"
