"""The web example's page in a real headless Chromium (Debian's package, driven by Playwright).

The events appear, a steering message shows up in the stream, the approval buttons settle the
call, and the stop button cancels the run. With CI=true and no browser this fails: it never
skips there.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # mypy resolves the kit as tests.web_kit (explicit package bases)
    from tests.web_kit import CHROMIUM, uvicorn_app
else:  # pytest puts tests/ on sys.path (rootdir "prepend" import mode)
    from web_kit import CHROMIUM, uvicorn_app

WAIT_MS = 30_000  # generous fail-instead-of-hang bound

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture
def page() -> Iterator[Any]:
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is missing: `just browser` (or apt-get install chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser.new_page()
        finally:
            browser.close()


def test_the_page_streams_steers_approves_and_stops(page: Any, tmp_path: Path) -> None:
    with uvicorn_app(tmp_path, STEERABLE_WEB_SLICES="2") as base:
        page.set_default_timeout(WAIT_MS)
        page.goto(base + "/")
        page.fill("#task", "Lisbon")
        page.click("#start")
        page.wait_for_selector("#events li[data-kind=tool_started]")
        page.fill("#message", "museums")
        page.click("#send")
        # The run waits for the booking's approval; the queued message waits with it.
        page.wait_for_selector(".approval button.approve")
        page.click(".approval button.approve")
        delivered = page.wait_for_selector("#events li[data-kind=message_delivered]")
        assert "museums" in delivered.inner_text()
        page.wait_for_selector("#state.ended")
        assert page.inner_text("#state") == "finished"
        kinds = page.eval_on_selector_all("#events li", "items => items.map(i => i.dataset.kind)")
        assert kinds[-1] == "run_ended"
        seqs = page.eval_on_selector_all("#events li", "items => items.map(i => +i.dataset.seq)")
        assert seqs == list(range(len(seqs)))  # every event once, in order

        # A second run, stopped from the page while it waits for a person.
        page.click("#start")
        page.wait_for_selector(".approval button.deny")
        page.click("#stop")
        page.wait_for_selector("#state.ended")
        assert page.inner_text("#state") == "cancelled"
