"""The live board page in a real browser (headless Chromium over WebDriver) against a running
stack (the real worker, an API process, Kafka and Redis), with read tokens required: opened with
?token=, it keeps the token in an HttpOnly cookie, shows the API's top 10, follows the board as
events arrive without a reload, shows a member's meta as text (never markup), switches window,
and finds a member. A screenshot is kept in test-artifacts/."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from common.errors import StackError
from common.settings import Settings
from rankstream.stack import ensure_chromium, free_port
from rankstream.topics import ensure_topics
from tests.helpers import api_env, http_status, running_worker, wait_for

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
TOKEN = "page-read-token-" + uuid.uuid4().hex
CONFIG = """
timezone: UTC
types:
  gift: {windows: [total, day], tie_break: first, late_grace: 2d}
"""
DAY_MS = 86_400_000
BOARD = "gift:page"
# a name that would add markup, were it written as HTML
HOSTILE = '<script>document.title="pwned"</script><img src=x onerror="document.body.dataset.pwned=1">'


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    try:
        chromium, chromedriver = ensure_chromium()
    except StackError as exc:
        pytest.fail(f"the board page test needs a browser: {exc}", pytrace=False)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1100,1300"):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=chromedriver))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def stack(make_settings: Callable[..., Settings], tmp_path: Path) -> Iterator[tuple[Settings, str]]:
    path = tmp_path / "boards.yaml"
    path.write_text(CONFIG)
    settings = make_settings(boards=path)
    ensure_topics(settings)
    port = free_port()
    env = {**api_env(settings, port), "RANKSTREAM_API_READ_TOKENS": TOKEN}
    log = (tmp_path / "api.log").open("wb")
    api = subprocess.Popen([sys.executable, "-m", "rankstream.cli", "api"], env=env, stdout=log, stderr=log)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: http_status(f"{base}/readyz") == 200, 60, "api ready")
        with running_worker(settings):
            yield settings, base
    finally:
        api.kill()
        api.wait()
        log.close()


def send(settings: Settings, producer: Any, events: list[dict[str, Any]]) -> None:
    for event in events:
        producer.produce(settings.topic_updates, orjson.dumps({"id": uuid.uuid4().hex, **event}),
                         key=event["board"].encode())  # fmt: skip
    assert producer.flush(10) == 0


def api_get(base: str, path: str) -> Any:
    request = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {TOKEN}"})  # noqa: S310
    with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310 - loopback
        return orjson.loads(resp.read())


def shown(driver: webdriver.Chrome, table: str = "top") -> list[list[str]]:
    """The rows the page shows: rank, trend, name, member, score (as text)."""
    try:
        rows = driver.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr")
        return [[td.text for i, td in enumerate(r.find_elements(By.TAG_NAME, "td")) if i != 2] for r in rows]
    except StaleElementReferenceException:  # redrawn as it was read: read it again
        return []


def expected(answer: dict[str, Any]) -> list[list[str]]:
    """The rows the page should show for an API answer."""
    rows = []
    for item in answer["items"]:
        meta = item.get("meta") or {}
        trend = ""
        if "prev_rank" in item:
            prev = item["prev_rank"]
            moved = 0 if prev is None else prev - item["rank"]
            trend = (
                "new" if prev is None else "=" if not moved else f"{'▲' if moved > 0 else '▼'} {abs(moved)}"
            )
        score = item["score"]
        text = str(int(score)) if float(score).is_integer() else str(score)
        rows.append([str(item["rank"]), trend, str(meta.get("name", "")), item["member"], text])
    return rows


def until_shown(driver: webdriver.Chrome, base: str, path: str, table: str = "top") -> list[list[str]]:
    """Wait until the page shows what the API answers for `path` now."""
    last: dict[str, Any] = {}

    def same(_: object) -> bool:
        last["api"] = expected(api_get(base, path))
        last["page"] = shown(driver, table)
        return bool(last["api"]) and last["page"] == last["api"]

    try:
        WebDriverWait(driver, 30, poll_frequency=0.1).until(same)
    except WebDriverException as exc:
        raise AssertionError(f"the page showed {last.get('page')}, the API {last.get('api')}") from exc
    page: list[list[str]] = last["page"]
    return page


def test_the_board_page_follows_the_board_live_in_a_real_browser(browser, stack, producer):
    settings, base = stack
    members = [f"m{i:02d}" for i in range(15)]
    send(settings, producer, [
        {"board": BOARD, "member": m, "score": 10 * (i + 1),
         "meta": {"name": HOSTILE if m == "m14" else f"Player {i}", "avatar": "https://example.invalid/a.png"}}
        for i, m in enumerate(members)
    ])  # fmt: skip
    yesterday = int(time.time() * 1000) - DAY_MS  # a previous day: the day window's trend arrows
    before = {f"m{i:02d}": 12 - i for i in range(12)} | {"m05": 50}  # m05 led yesterday
    send(settings, producer, [{"board": BOARD, "member": m, "score": score, "ts": yesterday}
                              for m, score in before.items()])  # fmt: skip
    wait_for(lambda: api_get(base, f"/v1/boards/{BOARD}/top")["total"] == 15, 30, "the events applied")

    assert http_status(f"{base}/boards/{BOARD}") == 401  # read tokens are required
    browser.get(f"{base}/boards/{BOARD}?token={TOKEN}")
    assert "token" not in browser.current_url  # the redirect took it out of the address
    cookie = browser.get_cookie("rankstream_token")
    assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Lax"
    assert browser.execute_script("return document.cookie") == ""  # the page's script never sees it

    first = until_shown(browser, base, f"/v1/boards/{BOARD}/top?limit=10")
    # the hostile name, shown as text: were it written as HTML, its text would be empty and the
    # cell would hold a script and an image
    assert first[0][3] == "m14" and first[0][2] == HOSTILE
    assert browser.find_elements(By.CSS_SELECTOR, "#top script, #top td.name img") == []
    assert (
        browser.find_element(By.CSS_SELECTOR, "#top td.avatar img").get_attribute("src").startswith("https:")
    )

    browser.execute_script("window.loadedOnce = 'yes'")  # gone if the page reloads
    send(settings, producer, [{"board": BOARD, "member": "m00", "score": 1000},
                              {"board": BOARD, "member": "late", "score": 500}])  # fmt: skip
    moved = until_shown(browser, base, f"/v1/boards/{BOARD}/top?limit=10")
    assert [row[3] for row in moved[:2]] == ["m00", "late"]
    assert browser.execute_script("return window.loadedOnce") == "yes"
    ARTIFACTS.mkdir(exist_ok=True)
    assert browser.save_screenshot(str(ARTIFACTS / "board-page.png"))

    Select(browser.find_element(By.ID, "window")).select_by_value("day")  # the day: trend arrows
    day = until_shown(browser, base, f"/v1/boards/{BOARD}/top?limit=10&window=day&trend=1")
    assert {row[1][0] for row in day} >= {"▲", "▼", "n"}  # risen, fallen and new since yesterday
    assert "window=day" in browser.current_url

    search = browser.find_element(By.ID, "member")
    search.send_keys("m05")
    browser.find_element(By.CSS_SELECTOR, "#search button").click()
    member = api_get(base, f"/v1/boards/{BOARD}/members/m05?window=day")
    WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "found").text.startswith("m05:"))
    assert (
        browser.find_element(By.ID, "found").text == f"m05: rank {member['rank']}, score {member['score']:g}"
    )
    until_shown(browser, base, f"/v1/boards/{BOARD}/members/m05/around?n=5&window=day&trend=1", "around")


def test_the_index_lists_board_types_and_opens_a_board(browser, stack):
    _, base = stack
    browser.get(f"{base}/?token={TOKEN}")
    assert "token" not in browser.current_url
    types = browser.find_element(By.ID, "types").text
    assert "gift (total, day)" in types
    field = browser.find_element(By.NAME, "board")
    field.send_keys(BOARD)
    field.submit()
    WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "board").text == BOARD)
    assert browser.current_url.startswith(f"{base}/boards/{BOARD}")
