"""The documentation site in a real browser: the strictly built site, served on 127.0.0.1, shows its index,
the ``Trainer`` entry of the API reference and a tutorial with its figure.

Needs the docs extra (``pip install -e ".[docs]"``), playwright and Chromium at ``/usr/bin/chromium`` (or
``MTLAB_CHROMIUM``); skipped, with the reason, when one is missing. Screenshots go to ``MTLAB_DOCS_SCREENSHOTS``
when set (not ``MTLAB_SCREENSHOTS``, which writes the README's pictures into docs/).
"""

from __future__ import annotations

import functools
import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a site build, a server and a browser

from helpers.browser import CHROMIUM, FLAGS, sync_api
from helpers.docs_site import built_site


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        """No request log on stderr."""


@pytest.fixture
def site_url() -> Iterator[str]:
    """The built site served from a thread on a free port of 127.0.0.1."""
    handler = functools.partial(Quiet, directory=str(built_site()))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def shot(page: object, name: str) -> None:
    folder = os.environ.get("MTLAB_DOCS_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / name))  # type: ignore[attr-defined]


def test_index_trainer_api_and_a_tutorial_with_its_figure(site_url: str) -> None:
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(f"{site_url}/", wait_until="load")
            assert "mtlab" in page.title()
            assert page.get_by_role("heading", name="Where to go").is_visible()
            shot(page, "docs_index.png")

            page.goto(f"{site_url}/api/mtlab/#mtlab.Trainer", wait_until="load")
            entry = page.locator('[id="mtlab.core.trainer.Trainer"]')
            entry.wait_for(state="visible")
            assert "Trainer" in entry.inner_text()
            method = page.locator('[id="mtlab.core.trainer.Trainer.process_minibatch"]')
            assert method.count() == 1
            assert page.locator('[id="mtlab.Trainer"]').count() == 1
            shot(page, "docs_api_trainer.png")

            page.goto(f"{site_url}/tutorials/02_accumulation_explained/", wait_until="load")
            figure = page.locator("img[src^='data:image/png']").last
            figure.scroll_into_view_if_needed()
            figure.wait_for(state="visible")
            size = figure.evaluate("img => [img.naturalWidth, img.naturalHeight, img.complete]")
            assert size[2] and size[0] > 200 and size[1] > 100, size
            assert page.locator(".jp-CodeCell").count() >= 3  # the notebook's cells, with their outputs
            shot(page, "docs_tutorial_figure.png")
        finally:
            browser.close()
