"""The operator's console in a real browser: headless Chromium driven by Selenium, against the
real server binary, with grpcurl as the gRPC client.

One operator's night, in order: a tool call of tenant acme ends with an unknown outcome (its
arguments carry a <script>); the operator signs in with acme's token, sees it on the landing
page, opens it (the script shows as text and never runs), and resolves it as found with the
result; the next Claim over gRPC is REPLAYED with that result. Tenant globex's token sees
nothing of it. A form sent without its CSRF token is refused and changes nothing. The replay
rate is drawn. A resolve form rendered before a reconciler took its entry changes nothing and
says so; an entry marked as a possible double effect is shown first and acknowledged with a
note. An approver approves one gated call and denies another (the agent's next claims act
once and are told why); a member without the role sees the requests and no forms. A
screenshot of each page is written to docs/images/ (or $CONSOLE_SCREENSHOTS).

Run by run.sh beside this file (which installs the pinned requirements and finds the server):

    tests/browser/run.sh
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

REPO = Path(__file__).resolve().parents[2]
SHOTS = Path(os.environ.get("CONSOLE_SCREENSHOTS", REPO / "docs" / "images"))
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ACME, GLOBEX = "token-acme-7f3k", "token-globex-q9x2"
BOSS = "token-acme-boss-2m8w"
HOSTILE = {"amount": 200, "currency": "EUR", "memo": "<script>window.pwned = 1</script>"}
RESULT = {"credit_id": "cr-4411", "amount": 200, "currency": "EUR"}
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class Server:
    """A running idempotency-ledger: its gRPC address and its console's URL."""

    grpc: str
    console: str
    process: subprocess.Popen[str]
    log: list[str]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    binary = os.environ.get("LEDGER_BIN", str(REPO / "target" / "debug" / "idempotency-ledger"))
    workdir = Path(tempfile.mkdtemp(prefix="console-browser-"))
    tokens = workdir / "tokens"
    tokens.write_text(f"acme {ACME}\nacme {BOSS} approver=dana\nglobex {GLOBEX}\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not (k.startswith("LEDGER_") or k == "DATABASE_URL")}
    env["RUST_LOG"] = "info"
    process = subprocess.Popen(
        [
            binary,
            "--listen", "127.0.0.1:0",
            "--database-url", f"sqlite://{workdir / 'ledger.db'}",
            "--auth-tokens-file", str(tokens),
            "--console-listen", "127.0.0.1:0",
            "--replay-alarm-min-claims", "5",
            # A reconciler (grpcurl here) may take an unknown outcome at once.
            "--reconcile-grace", "0s",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stderr is not None
    log: list[str] = []
    grpc = console = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            raise AssertionError("the server exited during start-up:\n" + "".join(log))
        line = ANSI.sub("", line)
        log.append(line)
        if "operator console: open" in line:
            console = re.search(r"url=(\S+)", line).group(1)  # type: ignore[union-attr]
        if "idempotency-ledger starting" in line:
            grpc = re.search(r"listen=(\S+)", line).group(1)  # type: ignore[union-attr]
        if "store reachable" in line:
            break
    assert grpc and console, "no addresses in the start-up log:\n" + "".join(log)
    # Keep draining stderr, so the server never blocks on a full pipe.
    threading.Thread(target=lambda: [log.append(l) for l in process.stderr], daemon=True).start()  # type: ignore[union-attr]
    yield Server(grpc=grpc, console=console.rstrip("/"), process=process, log=log)
    process.terminate()
    process.wait(timeout=30)
    shutil.rmtree(workdir, ignore_errors=True)


def grpcurl(server: Server, method: str, request: dict[str, Any], token: str) -> dict[str, Any]:
    """Calls `method` of the ledger service with grpcurl (reflection, plaintext) as `token`."""
    out = subprocess.run(
        [
            shutil.which("grpcurl") or "grpcurl",
            "-plaintext",
            "-H", f"authorization: Bearer {token}",
            "-d", json.dumps(request),
            server.grpc,
            f"idempotency.v1.LedgerService/{method}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, f"grpcurl {method}: {out.stderr}"
    return json.loads(out.stdout)


def claim(server: Server, token: str, tool: str, arguments: dict[str, Any], run: str = "run-night-shift", **extra: Any) -> dict[str, Any]:
    return grpcurl(
        server,
        "Claim",
        {"runId": run, "tool": tool, "argumentsJson": json.dumps(arguments), **extra},
        token,
    )


def unknown_outcome(server: Server, token: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Claims and reports the outcome unknown, as a client whose call timed out does."""
    claimed = claim(server, token, tool, arguments)
    assert claimed["outcome"] == "OUTCOME_CLAIMED", claimed
    entry = claimed["entry"]
    grpcurl(
        server,
        "Complete",
        {"key": entry["key"], "claimToken": claimed["claimToken"], "status": "STATUS_UNKNOWN", "error": "the bank's API timed out"},
        token,
    )
    return entry


@pytest.fixture()
def browser() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="console-chromium-")
    for flag in [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1360,1000",
        f"--user-data-dir={profile}",
    ]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def screenshot(driver: WebDriver, name: str) -> None:
    """Writes the whole page to SHOTS/name.png."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1360, max(600, min(int(height) + 40, 2400)))
    driver.save_screenshot(str(SHOTS / f"{name}.png"))
    driver.set_window_size(1360, 1000)


def sign_in(driver: WebDriver, server: Server, token: str, name: str = "") -> None:
    driver.get(server.console + "/")
    assert driver.current_url.endswith("/signin"), driver.current_url
    driver.find_element(By.NAME, "token").send_keys(token)
    if name:
        driver.find_element(By.NAME, "operator").send_keys(name)
    submit(driver, driver.find_element(By.CSS_SELECTOR, "form[action='/signin'] button"))
    assert driver.current_url == server.console + "/", (driver.current_url, text(driver))


def submit(driver: WebDriver, button: WebElement) -> None:
    """Clicks a form's button and waits until the answer's page has replaced this one.

    While the old page is being torn down, chromedriver can answer a question about the button
    with an inspector error ("Node with given id does not belong to the document") instead of
    a stale reference; that answer is asked again, not taken as a failure.
    """
    button.click()
    WebDriverWait(driver, 30, ignored_exceptions=(WebDriverException,)).until(expected_conditions.staleness_of(button))
    WebDriverWait(driver, 30).until(lambda d: d.execute_script("return document.readyState") == "complete")


def text(driver: WebDriver) -> str:
    return driver.find_element(By.TAG_NAME, "body").text


def test_an_operator_resolves_an_unknown_outcome_that_then_replays(server: Server, browser: WebDriver) -> None:
    entry = unknown_outcome(server, ACME, "issue_credit", HOSTILE)
    # Traffic for the replay-rate picture: replays of one tool, fresh keys of another (its
    # alarm, at 5 claims without a replay), and a key reused with other arguments.
    done = claim(server, ACME, "send_reply", {"ticket": 7})
    grpcurl(server, "Complete", {"key": done["entry"]["key"], "claimToken": done["claimToken"], "status": "STATUS_SUCCEEDED", "result": base64.b64encode(b"sent").decode()}, ACME)
    for _ in range(3):
        assert claim(server, ACME, "send_reply", {"ticket": 7})["outcome"] == "OUTCOME_REPLAYED"
    for n in range(6):
        claim(server, ACME, "open_ticket", {"n": n}, run=f"run-{n}")
    claim(server, ACME, "issue_refund", {"order": 1}, key="order-1:refund")
    reused = subprocess.run(
        ["grpcurl", "-plaintext", "-H", f"authorization: Bearer {ACME}", "-d",
         json.dumps({"key": "order-1:refund", "tool": "issue_refund", "argumentsJson": json.dumps({"order": 2})}),
         server.grpc, "idempotency.v1.LedgerService/Claim"],
        capture_output=True, text=True, timeout=60,
    )
    assert "KEY_REUSED_WITH_DIFFERENT_REQUEST" in reused.stderr, reused

    driver = browser
    driver.get(server.console + "/")
    assert driver.current_url.endswith("/signin")
    screenshot(driver, "console-sign-in")
    sign_in(driver, server, ACME, "ada")

    # The landing page: the unknown outcome, with its tool, external_ref, attempt and run.
    page = text(driver)
    assert "Needs a person" in page
    assert entry["externalRef"] in page, page
    row = driver.find_element(By.XPATH, f"//tr[td[contains(., '{entry['externalRef']}')]]")
    for value in ("issue_credit", "run-night-shift", "1"):
        assert value in row.text, row.text
    # Open one resolve form for the picture.
    row.find_element(By.TAG_NAME, "summary").click()
    screenshot(driver, "console-needs-a-person")

    # The entry's page: the stored <script> is text, and it never ran.
    row.find_element(By.CSS_SELECTOR, "a[href^='/entry']").click()
    assert "/entry?key=" in driver.current_url
    arguments = driver.find_elements(By.TAG_NAME, "pre")[0].text
    assert '"memo": "<script>window.pwned = 1</script>"' in arguments, arguments
    assert driver.execute_script("return window.pwned === undefined")
    assert not driver.find_elements(By.XPATH, "//script")
    screenshot(driver, "console-entry-unknown")

    # Resolve it: found, with the result.
    form = driver.find_element(By.CSS_SELECTOR, "form.resolve")
    form.find_element(By.CSS_SELECTOR, "input[value='found']").click()
    form.find_element(By.NAME, "result").send_keys(json.dumps(RESULT))
    submit(driver, form.find_element(By.TAG_NAME, "button"))
    page = text(driver)
    assert "recorded as resolved by console:ada" in page, page
    assert "REPLAYED with this result" in page, page
    screenshot(driver, "console-entry-resolved")

    # Over gRPC, the next Claim is REPLAYED with the result the operator gave.
    again = claim(server, ACME, "issue_credit", HOSTILE)
    assert again["outcome"] == "OUTCOME_REPLAYED", again
    assert json.loads(base64.b64decode(again["entry"]["result"])) == RESULT
    assert again["entry"]["resolvedBy"] == "console:ada"
    driver.get(server.console + "/")
    assert "Nothing needs a person." in text(driver)

    # The entries, filtered, and the replay rate.
    driver.get(server.console + "/entries?run=run-night-shift")
    assert entry["externalRef"] in text(driver)
    screenshot(driver, "console-entries")
    driver.get(server.console + "/replay-rate")
    page = text(driver)
    for tool in ("issue_credit", "send_reply", "open_ticket", "issue_refund"):
        assert tool in page, page
    assert len(driver.find_elements(By.CSS_SELECTOR, ".chart svg")) == 5
    assert driver.find_elements(By.CSS_SELECTOR, "svg .alarm"), "open_ticket's alarm is marked"
    assert driver.find_elements(By.CSS_SELECTOR, "svg .reuse"), "the key reuse is marked"
    screenshot(driver, "console-replay-rate")


def test_another_tenants_token_sees_nothing_of_it(server: Server, browser: WebDriver) -> None:
    entry = unknown_outcome(server, ACME, "issue_credit", {"amount": 5, "for": "globex test"})
    driver = browser
    sign_in(driver, server, GLOBEX)
    page = text(driver)
    assert driver.find_element(By.CSS_SELECTOR, "header .who b").text == "globex"
    assert "Nothing needs a person." in page, page
    assert entry["externalRef"] not in page
    screenshot(driver, "console-other-tenant")
    driver.get(server.console + "/entries")
    assert "No entry matches." in text(driver)
    assert entry["externalRef"] not in text(driver)
    driver.get(f"{server.console}/entry?key={entry['key']}")
    assert "No such entry" in text(driver)
    driver.get(f"{server.console}/find?q={entry['externalRef']}")
    assert "no entry with key" in text(driver)
    driver.get(server.console + "/replay-rate")
    assert "issue_credit" not in text(driver)
    # Acme's entry is untouched, and acme still sees it.
    looked = grpcurl(server, "Lookup", {"key": entry["key"]}, ACME)["entry"]
    assert looked["status"] == "STATUS_UNKNOWN"


def test_a_form_sent_without_its_csrf_token_changes_nothing(server: Server, browser: WebDriver) -> None:
    entry = unknown_outcome(server, ACME, "issue_credit", {"amount": 9, "for": "csrf test"})
    driver = browser
    sign_in(driver, server, ACME, "mallory")
    driver.get(f"{server.console}/entry?key={entry['key']}")
    form = driver.find_element(By.CSS_SELECTOR, "form.resolve")
    # What a forged form lacks: the session's token.
    driver.execute_script("arguments[0].querySelector(\"input[name='csrf']\").remove()", form)
    form.find_element(By.CSS_SELECTOR, "input[value='found']").click()
    form.find_element(By.NAME, "result").send_keys('{"forged": true}')
    submit(driver, form.find_element(By.TAG_NAME, "button"))
    page = text(driver)
    assert "Forbidden" in page and "nothing was changed" in page, page
    screenshot(driver, "console-csrf-refused")
    looked = grpcurl(server, "Lookup", {"key": entry["key"]}, ACME)["entry"]
    assert looked["status"] == "STATUS_UNKNOWN", looked
    assert "resolvedBy" not in looked, looked


def take(server: Server, key: str, token: str) -> dict[str, Any]:
    """Takes the entry as a reconciler does (Reconcile with its key): the pending entry."""
    pending = grpcurl(server, "Reconcile", {"keys": [key], "principal": "reconciler-7"}, token).get("pending", [])
    assert [e["key"] for e in pending] == [key], pending
    return pending[0]


def test_a_resolve_form_rendered_before_a_reconciler_took_the_entry_changes_nothing(server: Server, browser: WebDriver) -> None:
    entry = unknown_outcome(server, ACME, "issue_credit", {"amount": 12, "for": "moved on"})
    driver = browser
    sign_in(driver, server, ACME, "ada")
    driver.get(f"{server.console}/entry?key={entry['key']}")
    form = driver.find_element(By.CSS_SELECTOR, "form.resolve")
    assert form.find_element(By.NAME, "attempt").get_attribute("value") == "1"
    # While the operator reads the page, a reconciler takes the entry.
    take(server, entry["key"], ACME)
    form.find_element(By.CSS_SELECTOR, "input[value='not_found']").click()
    submit(driver, form.find_element(By.TAG_NAME, "button"))
    page = text(driver)
    assert "moved on since this page showed it" in page, page
    assert "nothing else was changed" in page, page
    screenshot(driver, "console-moved-on")
    looked = grpcurl(server, "Lookup", {"key": entry["key"], "includeHistory": True}, ACME)
    assert looked["entry"]["status"] == "STATUS_UNKNOWN", looked
    assert [e["kind"] for e in looked["history"]] == ["finding_stale"], looked
    assert looked["history"][0]["principal"] == "console:ada", looked


def test_a_possible_double_effect_is_shown_first_and_acknowledged(server: Server, browser: WebDriver) -> None:
    marked = unknown_outcome(server, ACME, "issue_credit", {"amount": 70, "for": "twice?"})
    other = unknown_outcome(server, ACME, "issue_credit", {"amount": 71, "for": "still unknown"})
    held = take(server, marked["key"], ACME)
    fence = {"key": marked["key"], "attempt": held["attempt"], "holdToken": held["holdToken"]}
    # A first read found nothing; a second read of the same attempt found the credit after all.
    grpcurl(server, "Reconcile", {"resolutions": [{**fence, "status": "STATUS_FAILED", "error": "no credit", "retryable": True}], "principal": "reconciler-7"}, ACME)
    grpcurl(server, "Reconcile", {"resolutions": [{**fence, "status": "STATUS_SUCCEEDED", "result": base64.b64encode(b'{"credit_id":"cr-70"}').decode()}], "principal": "reconciler-7"}, ACME)
    assert grpcurl(server, "Lookup", {"key": marked["key"]}, ACME)["entry"]["possibleDoubleEffect"] is True

    driver = browser
    sign_in(driver, server, ACME, "ada")
    page = text(driver)
    assert "Possible double effects (1)" in page, page
    assert page.index("Possible double effects") < page.index(other["externalRef"]), page
    assert "the effect of attempt 1 exists" in page, page
    screenshot(driver, "console-possible-double-effect")
    card = driver.find_element(By.CSS_SELECTOR, ".double-effect")
    card.find_element(By.TAG_NAME, "summary").click()
    card.find_element(By.NAME, "note").send_keys("refunded the duplicate credit cr-70b")
    submit(driver, card.find_element(By.TAG_NAME, "button"))
    page = text(driver)
    assert "Acknowledged the possible double effect" in page, page
    assert "Possible double effects (" not in page, page
    looked = grpcurl(server, "Lookup", {"key": marked["key"], "includeHistory": True}, ACME)
    assert "possibleDoubleEffect" not in looked["entry"], looked
    last = looked["history"][-1]
    assert (last["kind"], last["principal"], last["detail"]) == (
        "double_effect_acknowledged", "console:ada", "refunded the duplicate credit cr-70b"), last


def test_an_approver_approves_one_call_and_denies_another(server: Server, browser: WebDriver) -> None:
    refund_args = {"order": "o-5512", "amount": 480, "currency": "EUR"}
    delete_args = {"user": "u-77", "reason": "customer asked"}
    refund = claim(server, ACME, "issue_refund", refund_args, run="run-approvals", requireApproval=True)
    delete = claim(server, ACME, "delete_account", delete_args, run="run-approvals", requireApproval=True)
    for asked in (refund, delete):
        assert asked["outcome"] == "OUTCOME_AWAITING_APPROVAL", asked
        assert "claimToken" not in asked, "nothing may act before a decision"

    # A member without the approver role sees the requests, not the forms.
    driver = browser
    sign_in(driver, server, ACME, "ada")
    driver.get(server.console + "/approvals")
    page = text(driver)
    assert "issue_refund" in page and "delete_account" in page, page
    assert "without the approver role" in page, page
    assert not driver.find_elements(By.CSS_SELECTOR, "form[action='/decide']")
    driver.delete_all_cookies()

    sign_in(driver, server, BOSS)
    driver.get(server.console + "/approvals")
    page = text(driver)
    assert '"amount": 480' in page, page
    screenshot(driver, "console-approvals")
    cards = driver.find_elements(By.CSS_SELECTOR, ".request")
    refund_card = next(c for c in cards if refund["entry"]["key"][:16] in c.text)
    form = refund_card.find_element(By.CSS_SELECTOR, "form[action='/decide']")
    assert form.find_element(By.NAME, "fingerprint").get_attribute("value") == refund["entry"]["fingerprint"]
    form.find_element(By.NAME, "reason").send_keys("within the refund policy")
    submit(driver, form.find_element(By.CSS_SELECTOR, "button[value='approve']"))
    assert "Approved issue_refund" in text(driver), text(driver)
    cards = driver.find_elements(By.CSS_SELECTOR, ".request")
    delete_card = next(c for c in cards if delete["entry"]["key"][:16] in c.text)
    form = delete_card.find_element(By.CSS_SELECTOR, "form[action='/decide']")
    form.find_element(By.NAME, "reason").send_keys("ask the customer to confirm first")
    submit(driver, form.find_element(By.CSS_SELECTOR, "button[value='deny']"))
    page = text(driver)
    assert "Denied delete_account" in page and "recorded as decided by dana" in page, page
    assert "No call awaits a decision." in page and "Approved, not yet used (1)" in page, page
    screenshot(driver, "console-approvals-decided")

    # The agent's next claims: the approved call acts, once; the denied one is told why.
    acting = claim(server, ACME, "issue_refund", refund_args, run="run-approvals", requireApproval=True)
    assert acting["outcome"] == "OUTCOME_CLAIMED" and acting["claimToken"], acting
    told = claim(server, ACME, "delete_account", delete_args, run="run-approvals")
    assert told["outcome"] == "OUTCOME_DENIED", told
    approval = told["entry"]["approval"]
    assert (approval["decidedBy"], approval["reason"]) == ("dana", "ask the customer to confirm first"), approval
    again = claim(server, ACME, "issue_refund", refund_args, run="run-approvals", requireApproval=True)
    assert again["outcome"] != "OUTCOME_CLAIMED", again
    driver.get(f"{server.console}/entry?key={refund['entry']['key']}")
    page = text(driver)
    assert "approved by dana: within the refund policy" in page, page
    assert "the approval was used: the call acted" in page, page
