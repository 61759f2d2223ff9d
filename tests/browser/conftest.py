"""Browser tests: linescope's HTML report in a real headless Chromium (Debian's `chromium`
package driven by PyPI `playwright`; no browser download). Every page is opened from file://
with all http(s) requests aborted and recorded, so a test also proves the page stays offline.
The tests skip, saying why, only when Chromium or playwright is missing."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("LINESCOPE_CHROMIUM", "/usr/bin/chromium")


# Module scope, not session: playwright's sync API keeps an asyncio loop marked running on the
# main thread while it is open, which would break later tests that call asyncio.run().
@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed: pip install playwright into the venv "
                    "(scripts/setup.sh does); the browsers come from apt, never a download")
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        pytest.skip(f"Chromium not found at {CHROMIUM}: apt-get install chromium "
                    "(or set LINESCOPE_CHROMIUM)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


class Report:
    """One browser page on a report file, with the network blocked and watched."""

    def __init__(self, page) -> None:
        self.page = page
        self.blocked: list[str] = []  # http(s) requests the page attempted (all aborted)
        self.requests: list[str] = []  # every request URL
        self.errors: list[str] = []  # uncaught exceptions and console errors

    def open(self, path: Path, hash_: str = "") -> "Report":
        self.page.goto(Path(path).resolve().as_uri() + hash_)
        self.page.wait_for_selector("body[data-ready]")
        return self

    def nav(self, view: str) -> None:
        self.page.click(f'#sidebar a[data-nav="{view}"]')
        # The view changes on the hashchange event, after the click returns.
        self.page.wait_for_selector(f'#sidebar a[data-nav="{view}"][aria-current="page"]')

    def heading(self) -> str:
        return self.page.inner_text("main h1")

    def wait_heading(self, text: str) -> str:
        """The heading once it reads `text` (a link click renders its view on the hashchange
        event, after the click returns); times out (an error) if it never does."""
        self.page.wait_for_function(
            "t => (document.querySelector('main h1') || {}).innerText === t", arg=text,
            timeout=5000)
        return self.heading()

    def column_texts(self, table: str, key: str) -> list[str]:
        """The cell texts of column `key` (th[data-key]) of `table`, top to bottom."""
        return self.page.eval_on_selector(table, """(t, key) => {
            const i = [...t.tHead.rows[0].cells].findIndex((th) => th.dataset.key === key);
            if (i < 0) throw new Error("no column " + key);
            return [...t.tBodies[0].rows].map((r) => r.cells[i].innerText.trim());
        }""", key)

    def headers(self, table: str) -> list[str]:
        return self.page.eval_on_selector(
            table, "(t) => [...t.tHead.rows[0].cells].map((th) => th.dataset.key)")

    def sort(self, table: str, key: str) -> None:
        self.page.click(f'{table} th[data-key="{key}"] button')

    def js(self, expression: str, arg=None):
        return self.page.evaluate(expression, arg)


@pytest.fixture
def report(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    r = Report(page)

    def block(route):
        r.blocked.append(route.request.url)
        route.abort()

    context.route(re.compile(r"^https?://"), block)
    # A request the page's Content-Security-Policy refuses never reaches the router: record
    # those attempts too.
    context.add_init_script("""
        document.addEventListener("securitypolicyviolation", (e) => {
            console.error("CSP violation: " + e.violatedDirective + " " + e.blockedURI);
        });
    """)
    page.on("request", lambda req: r.requests.append(req.url))
    page.on("pageerror", lambda e: r.errors.append(f"page error: {e}"))
    page.on("console", lambda m: m.type == "error" and r.errors.append(f"console: {m.text}"))
    yield r
    context.close()
    assert r.errors == [], r.errors
    assert r.blocked == [], f"the report tried to reach the network: {r.blocked}"


@pytest.fixture(autouse=True)
def _isolated_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No pyproject.toml above the working directory ([tool.linescope] is tested elsewhere).
    monkeypatch.chdir(tmp_path)
