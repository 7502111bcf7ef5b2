#!/usr/bin/env bash
# Set up, then run the whole test suite. Fails if pytest collected no tests.
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh notebook,test || exit 1
.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: treating that as a failure" >&2
    exit 1
fi
exit "$rc"
