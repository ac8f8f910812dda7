"""The trace page in a real headless Chromium, offline: the chart is drawn and the page asks the network for nothing."""

import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from PIL import Image

from conductor.modules import Executor, Price, Step, WorkerPool, Workflow, render_trace_html
from conductor.testing import ScriptedWorker

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's chromium on PATH (scripts/setup.sh installs it: apt-get install chromium)"
)

ATTACK = "</text><script>alert(1)</script>"
FAILED_FILL = (0xFD, 0xEC, 0xEE)  # the failed step's box


class Dom(HTMLParser):
    """The rendered DOM's tags (with their attributes) and its visible text."""

    def __init__(self, markup: str):
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self._hidden = 0  # inside <style> or <title>
        self.feed(markup)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._hidden += tag in ("style", "title")

    def handle_endtag(self, tag):
        self._hidden -= tag in ("style", "title")

    def handle_data(self, data):
        if not self._hidden:
            self.text.append(data)

    def find(self, tag: str, class_prefix: str = "") -> list[dict[str, str | None]]:
        return [a for t, a in self.tags if t == tag and (a.get("class") or "").startswith(class_prefix)]


def open_offline(page: Path, tmp_path: Path) -> tuple[Dom, Path, list[str]]:
    """Open ``page`` in headless Chromium with every host name unresolvable; return its rendered DOM, a screenshot
    and the URLs the page itself requested (from Chromium's net log; the browser's own update checks are left out)."""
    screenshot, net_log = tmp_path / "page.png", tmp_path / "net.json"
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        f"--user-data-dir={tmp_path / 'profile'}",
        f"--log-net-log={net_log}",
        "--window-size=1200,900",
        f"--screenshot={screenshot}",
        "--dump-dom",
        page.as_uri(),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
    log = json.loads(net_log.read_text())
    names = {number: name for name, number in log["constants"]["logEventTypes"].items()}
    requested = [
        event["params"]["url"]
        for event in log["events"]
        if names[event["type"]] == "URL_REQUEST_START_JOB"
        and event.get("params", {}).get("initiator", "not an origin") != "not an origin"
    ]
    return Dom(done.stdout), screenshot, requested


def test_a_run_with_a_failed_step_is_drawn_offline_and_its_text_stays_text(tmp_path):
    pool = WorkerPool(
        [
            ScriptedWorker("planner", lambda _: "1. add 40 and 2", price=Price(1.0, 2.0)),
            ScriptedWorker("broken", fail_times=99, retries=0),
            ScriptedWorker("checker", lambda _: "42"),
        ]
    )
    steps = (Step(0, f"Plan {ATTACK} the sum", (), "plan"), Step(1, "Follow the plan", "all"), Step(2, "Check", (0, 1)))
    result = Executor(pool).run(Workflow(steps), "What is 40 + 2?")
    assert result.steps[1].error is not None and len(result.steps) == 2
    page = tmp_path / "run.html"
    page.write_text(render_trace_html(result, pool), encoding="utf-8")
    assert "http://" not in page.read_text() and "https://" not in page.read_text()

    dom, screenshot, requested = open_offline(page, tmp_path)

    assert requested == []
    assert [a for _, a in dom.tags if "src" in a or "href" in a] == [] and dom.find("script") == []
    assert len(dom.find("svg", "chart")) == 1
    boxes = dom.find("g", "step")
    assert [(b["data-index"], b["class"]) for b in boxes] == [
        ("0", "step ok"),
        ("1", "step failed"),
        ("2", "step not-run"),
    ]
    assert len(dom.find("rect")) == 3 and len(dom.find("path")) == 3  # arrows 0->1, 0->2, 1->2
    text = " ".join(dom.text)
    assert "flowchart TD" not in text and ATTACK in text  # the subtask is shown as written, not run
    assert "✗ failed: broken: scripted failure" in text and "not run · sees 0, 1" in text

    with Image.open(screenshot) as image:
        assert image.size == (1200, 900)
        colours = {colour for _, colour in image.convert("RGB").getcolors(1200 * 900)}
    assert FAILED_FILL in colours  # the SVG was painted, not left as source text


def test_the_network_check_catches_a_page_that_loads_from_a_cdn(tmp_path):
    page = tmp_path / "cdn.html"
    page.write_text(
        '<!doctype html><pre class="mermaid">flowchart TD</pre><script type="module">'
        'import mermaid from "https://cdn.jsdelivr.net/npm/mermaid@11/dist/mermaid.esm.min.mjs";</script>'
    )
    dom, _, requested = open_offline(page, tmp_path)
    assert requested == ["https://cdn.jsdelivr.net/npm/mermaid@11/dist/mermaid.esm.min.mjs"]
    assert "flowchart TD" in " ".join(dom.text)
