"""The web console in a real headless browser (G2): Debian's chromium driven by selenium.

Log in as the admin, see three nodes Up, see the live charts of node A get data
points while transactions commit through it (and B's and C's charts, fetched through
A, get samples; the cluster replicates its partitions, so A's replication lag chart
too, a series per partition) and its log view show the login, run a command
(disable then enable a partition on one node), load and activate a configuration
file chosen in a form and see it Active among the configuration versions, run an
application command's form and a command on the group of all nodes, add the monitor
user with the user.add form (a password input), see a node Down after a SIGKILL,
then log in as that monitor and be refused a command the role does not allow (a
built-in one, an application one), and the log view (permission admin).
Screenshots go to ``$NONSTOP_SCREENSHOTS`` (default: the test's temporary folder).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import nonstop
from nonstop.client.credentials import load_credentials
from tests.cluster.conftest import REAL_CLUSTER, app_cluster

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(not REAL_CLUSTER, reason="the partition table is the real cluster node's"),
    pytest.mark.skipif(
        CHROMIUM is None or CHROMEDRIVER is None,
        reason="needs Debian's chromium and chromium-driver (.ci/run installs them)",
    ),
]

MONITOR = ("watcher", "watcher-password-1")
CHARTS = ("chart-commits", "chart-latency", "chart-groups", "chart-group-size")


@pytest.fixture
def browser() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1200,1700"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def test_console_login_status_command_failure_and_refusal(browser: object, tmp_path: Path) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.support.ui import WebDriverWait

    driver = browser
    assert isinstance(driver, WebDriver)
    shots = Path(os.environ.get("NONSTOP_SCREENSHOTS", str(tmp_path)))
    shots.mkdir(parents=True, exist_ok=True)
    # The tables are redrawn every 2 s: read them in one script, and retry a stale element.
    wait = WebDriverWait(
        driver, 30, poll_frequency=0.2, ignored_exceptions=(StaleElementReferenceException,)
    )
    with app_cluster(
        tmp_path / "cluster",
        3,
        # Partitions replicated (ha.data): A's console has a replication lag chart too.
        {
            "app": ["tests.configmodel", "tests.distmodel", "tests.appcommands"],
            "ha": {"data": "partitions"},
        },
    ) as procs:
        admin = load_credentials(os.environ["NONSTOP_CREDENTIALS"])

        def log_in(user: str, password: str) -> None:
            driver.get(f"http://{procs.nodes['A'].admin}/console/")
            wait.until(lambda d: d.find_element(By.ID, "login-user").is_displayed())
            driver.find_element(By.ID, "login-user").send_keys(user)
            driver.find_element(By.ID, "login-password").send_keys(password)
            driver.find_element(By.ID, "login-button").click()
            wait.until(lambda d: user in d.find_element(By.ID, "who").text)

        def states() -> dict[str, str]:
            pairs = driver.execute_script(
                "return Array.from(document.querySelectorAll('#nodes tbody tr'))"
                ".map(r => [r.dataset.node, r.dataset.state]);"
            )
            return {str(n): str(s) for n, s in pairs}

        def run(form_id: str, **fields: str) -> str:
            form = driver.find_element(By.ID, form_id)
            for name, value in fields.items():
                box = form.find_element(By.NAME, name)
                box.clear()
                box.send_keys(value)
            driver.execute_script("window.confirm = () => true;")
            before = driver.find_element(By.ID, "result").text
            form.find_element(By.TAG_NAME, "button").click()
            wait.until(lambda d: d.find_element(By.ID, "result").text not in ("", before))
            return str(driver.find_element(By.ID, "result").text)

        # 1. Log in as the admin: three nodes Up (the one asked is Self).
        log_in(admin.user, admin.password)
        wait.until(lambda d: states() == {"A": "Self", "B": "Up", "C": "Up"})
        assert "quorum Active" in driver.find_element(By.ID, "summary").text
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#partitions tbody tr")) >= 16)
        # In their natural order: default.2 before default.10 (by index, not as text).
        shown = driver.execute_script(
            "return Array.from(document.querySelectorAll('#partitions tbody tr'))"
            ".map(r => r.dataset.partition);"
        )
        indexes = [int(str(n).rsplit(".", 1)[1]) for n in shown if str(n).startswith("default.")]
        assert len(indexes) > 10 and indexes == sorted(indexes), shown
        driver.save_screenshot(str(shots / "console-1-three-up.png"))

        # 1b. Transactions commit through A for a few seconds: every chart of A gets points
        #     above zero (commits/s, latency, group commits/s, group size).
        def nonzero() -> dict[str, int]:
            counts = driver.execute_script(
                "return Object.fromEntries(arguments[0].map(id => "
                "[id, Number(document.getElementById(id).dataset.nonzero)]));",
                list(CHARTS),
            )
            return {str(k): int(v) for k, v in counts.items()}

        from tests.distmodel import Account

        stop = threading.Event()

        def commit_for_a_while() -> None:
            with nonstop.connect(procs.address("A")) as db:
                i = 0
                while not stop.is_set():
                    try:
                        with db.transaction() as tx:
                            tx.create(Account, number=f"console-{i}", owner="c", balance=i)
                    except nonstop.errors.Retryable:
                        # A replicating cluster just started may still be settling which
                        # node acts for a partition (NotActive): try again, as a user would
                        # (an uncaught error ended this thread and the charts stayed empty).
                        time.sleep(0.1)
                        continue
                    i += 1
                    time.sleep(0.02)

        committer = threading.Thread(target=commit_for_a_while, daemon=True)
        committer.start()
        try:
            wait.until(lambda d: all(count >= 2 for count in nonzero().values()))
        finally:
            stop.set()
            committer.join(10)
        assert "A" in driver.find_element(By.ID, "charts-node").text
        # The cluster replicates its partitions: A's replication lag chart is drawn, with a
        # series per partition A is active for, and gets points.
        lag = (
            "const c = document.getElementById('chart-replication');"
            "return c ? [Number(c.dataset.points || 0),"
            " document.getElementById('chart-replication-legend').textContent] : [0, ''];"
        )
        wait.until(lambda d: d.execute_script(lag)[0] > 0)
        assert "default." in driver.execute_script(lag)[1]
        # Every other member's charts too, their samples fetched through A.
        member_points = (
            "return ['B', 'C'].map(n => Number((document.getElementById("
            "'chart-commits-node-' + n) || {dataset: {}}).dataset.points || 0));"
        )
        wait.until(lambda d: all(int(p) > 0 for p in d.execute_script(member_points)))
        legend = driver.find_element(By.ID, "chart-commits-legend").text
        assert "commits" in legend and "aborts" in legend, legend
        driver.execute_script("document.getElementById('metrics').scrollIntoView();")
        driver.save_screenshot(str(shots / "console-1b-charts.png"))
        driver.execute_script("document.getElementById('charts-of-B').scrollIntoView();")
        driver.save_screenshot(str(shots / "console-1b-other-nodes.png"))

        # 1c. The log view shows A's log, newest first: the admin's login is in it.
        def log_rows() -> list[str]:
            rows = driver.execute_script(
                "return Array.from(document.querySelectorAll('#logs tbody tr'))"
                ".map(r => r.textContent);"
            )
            return [str(r) for r in rows]

        # Filtered first: a replicating node logs its partitions' copies and takeovers, so
        # the unfiltered newest rows need not reach back to the login (it failed that way
        # on a clean clone).
        wait.until(lambda d: len(log_rows()) > 1)
        driver.find_element(By.ID, "logs-contains").send_keys("logged in")
        driver.find_element(By.ID, "logs-refresh").click()
        wait.until(lambda d: log_rows() and all("logged in" in row for row in log_rows()))
        driver.find_element(By.ID, "logs-contains").clear()
        driver.find_element(By.ID, "logs-refresh").click()
        wait.until(lambda d: len(log_rows()) > 1)
        driver.execute_script("document.getElementById('logs-view').scrollIntoView();")
        driver.save_screenshot(str(shots / "console-1c-logs.png"))

        # 2. Run a command: disable default.0 on its second node, then enable it again.
        nodes_of_default0 = driver.execute_script(
            "return document.querySelector('#partitions tr[data-partition=\"default.0\"]')"
            ".cells[4].textContent;"
        )
        second = str(nodes_of_default0).split(",")[1]
        text = run("cmd-partition-disable", name="default.0", on=second)
        assert "partition.disable: ok" in text and f'"node": "{second}"' in text, text
        text = run("cmd-partition-enable", name="default.0", on=second)
        assert "partition.enable: ok" in text, text
        driver.save_screenshot(str(shots / "console-2-command.png"))

        # 2b. Load and activate a configuration file chosen in the form (config.load).
        rates = tmp_path / "fx.toml"
        rates.write_text('type = "rates"\nname = "console"\nversion = "1"\neur = 1.2\n')
        form = driver.find_element(By.ID, "cmd-config-load")
        form.find_element(By.NAME, "files").send_keys(str(rates))
        form.find_element(By.NAME, "activate").click()
        before = driver.find_element(By.ID, "result").text
        form.find_element(By.TAG_NAME, "button").click()
        wait.until(lambda d: d.find_element(By.ID, "result").text not in ("", before))
        text = str(driver.find_element(By.ID, "result").text)
        assert "config.load: ok" in text and '"kind": "activate"' in text, text
        version = "#configurations tr[data-config='rates/console/1']"
        wait.until(
            lambda d: (
                d.find_element(By.CSS_SELECTOR, version).get_attribute("data-state") == "Active"
            )
        )

        # 2c. An application command's form (G4): it ran on A, in a transaction; a read
        #     command on every node of the group "all" (G3): one result per node.
        text = run("cmd-app-ledger-open", number="console-1", balance="4")
        assert "app.ledger.open: ok" in text and '"console-1"' in text, text
        text = run("cmd-node-status", **{"on-group": "all"})
        assert "node.status: ok" in text and text.count('"ok": true') == 3, text

        # 2d. The monitor of step 4 is added with the console's user.add form: its password
        #     box is a password input, emptied once sent; the password is not shown back.
        box = driver.find_element(By.CSS_SELECTOR, "#cmd-user-add input[name=password]")
        assert box.get_attribute("type") == "password"
        text = run("cmd-user-add", name=MONITOR[0], roles="monitor", password=MONITOR[1])
        assert "user.add: ok" in text and MONITOR[1] not in text, text
        assert box.get_attribute("value") == ""

        # 3. SIGKILL C: the console shows it Down.
        procs.kill("C")
        wait.until(lambda d: states().get("C") == "Down")
        assert states()["B"] == "Up"
        driver.execute_script("window.scrollTo(0, 0);")
        driver.save_screenshot(str(shots / "console-3-c-down.png"))

        # 4. A monitor is refused a changing command (403), shown as such.
        driver.find_element(By.ID, "logout").click()
        log_in(*MONITOR)
        denied = wait.until(lambda d: d.find_element(By.ID, "cmd-partition-enable"))
        assert "denied" in str(denied.get_attribute("class"))
        text = run("cmd-partition-enable", name="default.0")
        assert "refused (403)" in text and "admin" in text, text
        text = run("cmd-app-ledger-open", number="console-2", balance="1")
        assert "refused (403)" in text and "role:ledger.clerk" in text, text
        wait.until(lambda d: "refused (403)" in d.find_element(By.ID, "logs-error").text)
        assert driver.find_elements(By.CSS_SELECTOR, "#logs tbody tr") == []
        assert not driver.find_element(By.ID, "charts-error").text  # status: charts allowed
        driver.execute_script("document.getElementById('logs-view').scrollIntoView();")
        driver.save_screenshot(str(shots / "console-5-monitor-no-logs.png"))
        script_errors = [e for e in driver.get_log("browser") if e.get("source") == "javascript"]
        assert script_errors == [], script_errors
        driver.save_screenshot(str(shots / "console-4-monitor-refused.png"))
