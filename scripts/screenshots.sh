#!/usr/bin/env bash
# Refresh the README's widget pictures in docs/screenshots/ from real JupyterLab in Chromium (the test suite itself writes them to artifacts/screenshots/).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh notebook,test
PW_SCREENSHOTS_DIR=docs/screenshots PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec .venv/bin/python -m pytest -x -q -p no:cacheprovider \
    "tests/test_browser_widgets.py::test_the_readme_pictures_are_taken_from_these_widgets" "$@"
