"""The security tests' browser is the UI tests' one fixture (Debian's Chromium through Playwright)."""

from tests.ui.conftest import browser  # noqa: F401 (a fixture, found by name)
