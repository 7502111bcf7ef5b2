"""Debian's Chromium for the browser tests and the timeline benchmark (Playwright drives it; it downloads nothing)."""

from __future__ import annotations

import os

CHROMIUM = os.environ.get("PW_CHROMIUM", "/usr/bin/chromium")
#: Headless, no sandbox (root), and none of the background traffic a closed network refuses.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def available() -> bool:
    return os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)
