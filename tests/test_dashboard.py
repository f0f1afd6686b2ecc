"""The dashboard in a real headless Chromium (Debian's, driven by Playwright) against a
real `jigsaw up` with a local agent training a real job.

One browser session walks every page: sign-in (a refused token, then the real one),
cluster, jobs (filtered), the job's page while it trains (its charts grow between two
polls), the scheduler's rounds, cancelling from the job page, and signing out. No page
may log a console error or throw. A screenshot of each page goes to test-artifacts/.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import UNDER_CI
from tests.servers import HTTP_TIMEOUT_SECONDS, Server, jigsaw_up

CHROMIUM = os.environ.get("JIGSAW_TEST_CHROMIUM", "/usr/bin/chromium")
# Offline, quiet, and runnable as root in a container without a GPU.
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
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
TIMEOUT_MS = 60_000

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        message = f"no Chromium at {CHROMIUM}: apt-get install chromium (./dev install does)"
        if UNDER_CI:
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    with jigsaw_up(
        tmp_path, "--local-agents", "1", "--gpus-per-agent", "2",
        JIGSAW_SCHEDULER_ROUND_SECONDS="0.2",
        JIGSAW_API_REFUSE_UNPLACEABLE="false",  # an oversized job waits, saying why
    ) as up:  # fmt: skip
        yield up


def test_every_page_loads_and_follows_a_training_job(server: Server, browser: object) -> None:
    from playwright.sync_api import Browser, ConsoleMessage, expect

    assert isinstance(browser, Browser)
    ARTIFACTS.mkdir(exist_ok=True)
    token = server.token()
    api = httpx.Client(
        base_url=server.url,
        headers={"Authorization": f"Bearer {token}"},
        timeout=HTTP_TIMEOUT_SECONDS,
    )
    problems: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            problems.append(f"console: {message.text}")

    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.set_default_timeout(TIMEOUT_MS)
    expect.set_options(timeout=TIMEOUT_MS)
    page.on("console", on_console)
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))

    def shoot(name: str) -> None:
        page.screenshot(path=str(ARTIFACTS / f"dashboard-{name}.png"), full_page=True)

    # Served with a strict policy; the page itself needs no token, the data does.
    index = httpx.get(f"{server.url}/ui/", timeout=HTTP_TIMEOUT_SECONDS)
    assert index.status_code == 200
    assert "script-src 'self'" in index.headers["content-security-policy"]
    assert httpx.get(f"{server.url}/v1/cluster", timeout=HTTP_TIMEOUT_SECONDS).status_code == 401

    # Sign-in: a refused token says so; the real one opens the cluster view.
    page.goto(f"{server.url}/ui/")
    page.get_by_label("API token").fill("jsu_not-a-real-token")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_have_text("That token was refused.")
    shoot("login")
    # Chromium reports the refused request itself as a console error: that one only.
    assert [p for p in problems if "401 (Unauthorized)" not in p] == [], problems
    problems.clear()
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#whoami")).to_have_text("admin (admin)")
    expect(page.locator("[data-node=local-0] .gpu")).to_have_count(2)

    # A job submitted through the API shows up in the jobs table, filters included.
    spec = {
        "name": "dash-digits",
        "workload": "digits-mlp",
        "hyperparameters": {"batch_size": 32, "learning_rate": 0.05},
        "max_iterations": 1_000_000,  # runs until the test cancels it
    }
    job_id = api.post("/v1/jobs", json=spec).json()["id"]
    page.goto(f"{server.url}/ui/#/jobs")
    row = page.locator(f"#jobs tr[data-job='{job_id}']")
    expect(row).to_contain_text("dash-digits")
    page.get_by_label("State").select_option("SUCCEEDED")
    expect(page.locator("#jobs")).to_contain_text("No jobs match.")
    page.get_by_label("State").select_option("RUNNING")
    expect(row.locator(".badge")).to_have_text("RUNNING")
    shoot("jobs")

    # The job's page: its charts fill in and then grow without a reload.
    row.click()
    expect(page).to_have_url(re.compile(f"#/jobs/{job_id}$"))
    throughput = page.locator("[data-chart=throughput]")
    expect(throughput).to_have_attribute("data-points", re.compile(r"^[1-9]\d*$"))
    first = int(throughput.get_attribute("data-points") or 0)
    page.wait_for_function(
        "([first]) => +document.querySelector('[data-chart=throughput]').dataset.points > first",
        arg=[first],
    )
    expect(page.locator("[data-chart=loss] path")).to_have_count(1)
    # Nothing reports SPB depth yet: the chart says so instead of drawing nothing.
    expect(page.locator("[data-chart=spb-depth] .empty")).to_contain_text("No SPB depth")
    # Every job reports its workers and global batch (an elastic, adaptive one's change).
    expect(page.locator("[data-chart=workers] path")).to_have_count(1)
    expect(page.locator("[data-chart=batch] path")).to_have_count(1)
    expect(page.locator("#leases")).to_contain_text("SPB off")
    # A fixed batch's progress is its iterations (an adaptive one's says both).
    expect(page.locator("#progress")).to_have_text(re.compile(r"^\d+ / 1000000 iterations$"))
    expect(page.locator("#events")).to_contain_text("SCHEDULED → RUNNING")
    expect(page.locator("#logs")).not_to_be_empty()
    shoot("job")

    # The cluster view shows the job on its GPU with its live utilization.
    page.get_by_role("link", name="Cluster").click()
    tile = page.locator(".gpu.busy", has_text=f"#{job_id} dash-digits")
    expect(tile).to_contain_text("rank 0 · SPB off")
    expect(page.locator("#totals")).to_contain_text("1 / 2")
    shoot("cluster")
    # An admin's drain shows on the node's card (its job keeps running there).
    badge = page.locator("[data-node=local-0] header .badge")
    expect(badge).to_have_text("alive")
    assert api.post("/v1/nodes/local-0/drain").status_code == 200
    expect(badge).to_have_text("drained")
    expect(page.locator("[data-node=local-0] header")).to_contain_text("drained")
    expect(page.locator("#totals")).to_contain_text("1 / 2")
    assert api.post("/v1/nodes/local-0/undrain").status_code == 200
    expect(badge).to_have_text("alive")

    # The scheduler view: the lease decision and the latency of recorded rounds.
    page.get_by_role("link", name="Scheduler").click()
    expect(page.locator("#rounds .decision[data-kind=lease]").first).to_contain_text(f"#{job_id}")
    expect(page.locator("[data-chart=round-latency]")).to_have_attribute(
        "data-points", re.compile(r"^[1-9]\d*$")
    )
    shoot("scheduler")

    # A job no capacity can hold says why, in the jobs table and on its page.
    big = api.post("/v1/jobs", json={**spec, "name": "dash-big", "workers": 4}).json()["id"]
    reason = "needs 4 GPUs; the largest gang this cluster can form is 2"
    page.goto(f"{server.url}/ui/#/jobs")
    expect(page.locator(f"#jobs tr[data-job='{big}'] .pending-reason")).to_have_text(reason)
    page.goto(f"{server.url}/ui/#/jobs/{big}")
    expect(page.locator(".facts .pending-reason")).to_have_text(reason)
    expect(page.locator(".facts .position")).to_have_text("#1 in queue default · #1 overall")
    shoot("job-pending")
    # The queues view: the default queue's use and what waits in it.
    page.get_by_role("link", name="Queues").click()
    row = page.locator("#queues tr[data-queue=default]")
    expect(row).to_contain_text("what others leave")
    expect(row.locator("td").nth(8)).to_have_text("1")  # the big job pends
    shoot("queues")
    api.post(f"/v1/jobs/{big}/cancel")

    # Cancelling from the job page, then signing out.
    page.goto(f"{server.url}/ui/#/jobs/{job_id}")
    page.get_by_role("button", name="Cancel").click()
    expect(page.locator("h1 .badge")).to_have_text("CANCELLED")
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("button", name="Sign in")).to_be_visible()
    assert page.evaluate("sessionStorage.length + localStorage.length") == 0
    page.close()
    api.close()

    assert problems == []
