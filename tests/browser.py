"""Debian's Chromium, driven by Playwright, for the tests that look at pages: never a
downloaded browser (`make test` installs the Debian package; `make browser` alone does too).
Where either is missing, the test is skipped and says which."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

#: the flags a sandboxed, offline machine needs (no background requests to Google's hosts)
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@contextmanager
def browser() -> Iterator[Any]:
    """A headless Debian Chromium; skips the test where it (or Playwright) is missing."""
    path = chromium_path()
    if path is None:
        pytest.skip("Debian's chromium is not installed: `make browser` (as root) installs it")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed: `make install` installs the test extra")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


class Console:
    """A page's console errors and uncaught exceptions, to assert there are none."""

    def __init__(self, page: Any, errors: list[str] | None = None):
        self.errors: list[str] = [] if errors is None else errors  # one list for many tabs
        page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
