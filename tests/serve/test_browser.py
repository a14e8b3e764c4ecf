"""The page at ``/`` in a real browser: headless Chromium (Debian's ``chromium`` and ``chromium-driver``, which
``make install`` installs) opens it, starts a session on the built-in context, drives with the arrow keys and
sees the last context frame at once, then frames arrive and change; then narrows the window to a phone's 400 px,
where nothing may scroll sideways and the steering pad stays on the first screen. The
screenshots are saved as ``page.png`` and ``page-400px.png`` in the test's tmp folder."""

from __future__ import annotations

import shutil

import pytest

from tests.serve.conftest import TOKEN

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@pytest.fixture
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("chromium and chromium-driver are not installed (`make install` installs them)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1000,760"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def canvas(driver, element_id: str) -> str:
    return driver.execute_script(f"return document.getElementById('{element_id}').toDataURL('image/png')")


def frames(driver) -> int:
    return driver.execute_script("return window.terraStats.frames")


def test_drive_the_page_with_arrow_keys(server, browser, tmp_path):
    browser.get(f"{server.url}/?token={TOKEN}")
    WebDriverWait(browser, 30).until(lambda d: "model ready" in d.find_element(By.ID, "status").text)
    blank_view, blank_map = canvas(browser, "view"), canvas(browser, "map")
    browser.find_element(By.ID, "start").click()
    WebDriverWait(browser, 120).until(lambda d: d.find_element(By.ID, "drive").is_enabled())
    # before any key: the view shows the last context frame, not black
    WebDriverWait(browser, 30).until(lambda d: d.execute_script("return window.terraStats.contextShown"))
    context = canvas(browser, "view")
    assert context != blank_view and frames(browser) == 0

    keys = ActionChains(browser)
    keys.key_down(Keys.ARROW_UP).perform()  # the first key press starts driving
    WebDriverWait(browser, 120).until(lambda d: frames(d) >= 1)
    first = canvas(browser, "view")
    ActionChains(browser).key_down(Keys.ARROW_LEFT).perform()
    WebDriverWait(browser, 180).until(lambda d: frames(d) >= 5)
    ActionChains(browser).key_up(Keys.ARROW_LEFT).key_up(Keys.ARROW_UP).perform()
    later = canvas(browser, "view")

    assert first != blank_view and first != context and later != first  # frames arrived and changed
    assert canvas(browser, "map") != blank_map  # the top-down view drew the path
    stats = browser.execute_script("return window.terraStats")
    assert stats["errors"] == [] and stats["connected"] and stats["lastIndex"] >= 4
    assert int(browser.find_element(By.ID, "frame-index").text) >= 4
    assert browser.find_element(By.ID, "drive").text == "Pause"
    browser.find_element(By.ID, "drive").click()  # pause, so the screenshot shows a settled page
    screenshot = tmp_path / "page.png"
    assert browser.save_screenshot(str(screenshot)) and screenshot.stat().st_size > 10_000
    print(f"screenshot: {screenshot}")

    browser.set_window_size(400, 900)
    WebDriverWait(browser, 10).until(lambda d: d.execute_script("return window.innerWidth") <= 400)
    widths = browser.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
    assert widths[0] <= widths[1], f"the page scrolls sideways at 400 px: {widths}"
    view = browser.find_element(By.ID, "view").rect
    assert 0 <= view["x"] and view["x"] + view["width"] <= widths[1]  # the video shrinks to fit, whole
    # the steering pad sits right under the video, on the first screen: no scrolling to steer
    browser.execute_script("window.scrollTo(0, 0)")
    pad = browser.find_element(By.CSS_SELECTOR, ".pad").rect
    height = browser.execute_script("return window.innerHeight")
    print(f"at 400 px: video {view}, pad {pad}, window height {height}")
    assert view["y"] + view["height"] <= pad["y"] and pad["y"] + pad["height"] <= min(height, 720)
    narrow = tmp_path / "page-400px.png"
    assert browser.save_screenshot(str(narrow)) and narrow.stat().st_size > 5_000
    print(f"screenshot: {narrow}")
