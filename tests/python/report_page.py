#!/usr/bin/env python3
"""Browser checks of `assay report` pages in headless Chromium (chromedriver from the Debian
packages), driven by tests/tests/report.rs.

Usage: report_page.py '<json args>'. Each report file is opened from file:// and must log no
console error (a blocked script or style would: the page's Content-Security-Policy names its own
by hash and allows nothing else). Then:
  eval        the counts and aggregates the run holds, the responders and the forest plot (model-b
              below zero), the pager (1,000 rows written as HTML, Next builds the last 40 with the
              page's script, Previous brings the first back), and the hostile record ids of both
              pages shown as characters: no image, no extra script, nothing ran. Opened again with
              JavaScript off: the first page shows, the pager stays hidden.
  sequential  the confidence sequence as it narrowed: one row per update and the final one,
              decided "worse" and wholly below zero; what stopping saved.
  refinement  the outcome, the two changed sections with their text before (from --document) and
              after, their issues fixed.
  debate, self_refine, checklist
              each problem (a problem id holding markup as characters) and the accuracy; the final
              text and the passes; the generated checklist's items.
Only the checks of the files args names run.
Screenshots go to args["shots"] (report-eval.png, report-refinement.png). Prints OK at the end; any
failed check raises.
"""

import json
import os
import sys

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

WAIT = 30
ARGS = json.loads(sys.argv[1])


def browser(script=True):
    opts = webdriver.ChromeOptions()
    opts.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1280,1000", "--lang=en-US", "--hide-scrollbars"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    if not script:
        opts.add_argument("--blink-settings=scriptEnabled=false")
    return webdriver.Chrome(service=Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")), options=opts)


def wait(d, what, cond, timeout=WAIT):
    try:
        return WebDriverWait(d, timeout).until(lambda d: cond(d))
    except Exception as e:
        raise AssertionError(f"timed out waiting for {what}") from e


def one(d, css):
    found = d.find_elements(By.CSS_SELECTOR, css)
    assert found, f"no {css}"
    return found[0]


def text(d, css):
    return one(d, css).text


def open_report(d, path):
    d.get("file://" + os.path.abspath(path))
    wait(d, "the page", lambda d: d.execute_script("return document.readyState") == "complete")


def no_console_errors(d, what):
    errors = [e for e in d.get_log("browser") if e.get("level") == "SEVERE"]
    assert not errors, f"{what}: console errors: {errors}"


def untouched(d, what):
    """Nothing a record id held ran or became an element."""
    assert d.execute_script("return window.__pwned === undefined"), f"{what}: a record id ran"
    assert d.execute_script("return document.images.length") == 0, f"{what}: an image element"
    assert d.execute_script("return document.scripts.length") == 2, f"{what}: a script element"


def rows(d):
    return d.find_elements(By.CSS_SELECTOR, "#records tbody tr.record")


def record_id_cell(d, record_id):
    """The record-id cells of the rows whose data-record-id is `record_id` (read by script, so the
    id needs no CSS quoting)."""
    return d.execute_script(
        "return Array.from(document.querySelectorAll('#records tbody tr.record'))"
        ".filter((tr) => tr.dataset.recordId === arguments[0])"
        ".map((tr) => tr.querySelector('td.record-id').textContent)", record_id)


def shot(d, name, height, at=None):
    """A screenshot `height` pixels tall, from the top of the page or of the element `at`."""
    if not ARGS.get("shots"):
        return
    os.makedirs(ARGS["shots"], exist_ok=True)
    d.set_window_size(1280, height)
    if at:
        d.execute_script("document.querySelector(arguments[0]).scrollIntoView()", at)
    else:
        d.execute_script("window.scrollTo(0, 0)")
    d.save_screenshot(os.path.join(ARGS["shots"], f"{name}.png"))
    d.set_window_size(1280, 1000)


def check_eval(d):
    open_report(d, ARGS["eval"])
    no_console_errors(d, "eval")
    assert "checklist_eval" in d.title, d.title
    assert text(d, "#run-state") == "succeeded"
    assert text(d, "#results-total") == ARGS["results"], text(d, "#results-total")
    assert text(d, "#results-failed") == "0"
    assert text(d, "#mean") == ARGS["mean"], (text(d, "#mean"), ARGS["mean"])
    assert text(d, "#mean-ci") == ARGS["ci"], (text(d, "#mean-ci"), ARGS["ci"])
    names = [r.get_attribute("data-responder") for r in d.find_elements(By.CSS_SELECTOR, "#responders tr.responder")]
    assert names == ["model-a", "model-b"], names
    assert "baseline" in text(d, '#responders tr.responder[data-responder="model-a"]')
    diff = text(d, '#comparisons tr.comparison[data-candidate="model-b"] td.diff')
    assert diff == ARGS["diff"], (diff, ARGS["diff"])
    assert text(d, '#comparisons tr.comparison[data-candidate="model-b"] td.verdict') == "significantly worse"
    num = lambda e, a: float(e.get_attribute(a))
    zero = one(d, "#responder-forest line.zero")
    ci = one(d, '#responder-forest g[data-candidate="model-b"] line.interval')
    point = one(d, '#responder-forest g[data-candidate="model-b"] circle.point')
    assert num(ci, "x1") <= num(point, "cx") <= num(ci, "x2") < num(zero, "x1"), "model-b is worse: all below zero"
    worst = d.find_elements(By.CSS_SELECTOR, "#worst tbody tr")
    assert 0 < len(worst) <= 10 and all("model-b" in w.text for w in worst), [w.text for w in worst]
    assert d.find_elements(By.CSS_SELECTOR, "#worst .ans.n"), "the failed item of a worst record is marked"
    title = one(d, "#records tbody tr.record td.answers .ans").get_attribute("title")
    assert ": " in title, f"an answer is titled with its question: {title}"

    # The first page, written as HTML; the hostile id on it is characters.
    first, second = ARGS["hostile"]
    wait(d, "the pager", lambda d: one(d, "#records-pager").is_displayed())
    assert len(rows(d)) == 1000, len(rows(d))
    assert text(d, "#records-range") == "results 1–1,000 of 1,040", text(d, "#records-range")
    assert record_id_cell(d, first) == [first, first], record_id_cell(d, first)
    untouched(d, "first page")
    shot(d, "report-eval", 2300)

    # The second page, built by the script; its hostile id too.
    one(d, "#records-next").click()
    wait(d, "the second page", lambda d: one(d, "#records-range").get_attribute("data-page") == "1")
    assert len(rows(d)) == 40, len(rows(d))
    assert text(d, "#records-range") == "results 1,001–1,040 of 1,040", text(d, "#records-range")
    assert record_id_cell(d, second) == [second, second], record_id_cell(d, second)
    assert {c.text for c in d.find_elements(By.CSS_SELECTOR, "#records td.responder")} == {"model-a", "model-b"}
    assert one(d, "#records-next").get_attribute("disabled") is not None
    untouched(d, "second page")
    one(d, "#records-prev").click()
    wait(d, "the first page again", lambda d: one(d, "#records-range").get_attribute("data-page") == "0")
    assert len(rows(d)) == 1000 and record_id_cell(d, first) == [first, first]
    no_console_errors(d, "eval after paging")


def check_eval_without_script():
    d = browser(script=False)
    try:
        open_report(d, ARGS["eval"])
        assert one(d, "#records-page").get_attribute("textContent") == "", "the page's script did not run"
        assert not one(d, "#records-pager").is_displayed(), "no script: no pager"
        assert len(rows(d)) == 1000, len(rows(d))
        assert text(d, "#records-range") == "results 1–1,000 of 1,040"
        assert text(d, "#mean") == ARGS["mean"]
        cell = d.find_elements(By.CSS_SELECTOR, "#records tbody tr.record td.record-id")[6]
        assert cell.text == ARGS["hostile"][0], cell.text
    finally:
        d.quit()


def check_sequential(d):
    open_report(d, ARGS["sequential"])
    no_console_errors(d, "sequential")
    groups = d.find_elements(By.CSS_SELECTOR, '#sequential-forest g[data-candidate="model-b"]')
    assert len(groups) == ARGS["updates"] + 1, (len(groups), ARGS["updates"])
    final = one(d, '#sequential-forest g[data-final="true"][data-candidate="model-b"]')
    assert final.get_attribute("data-decision") == "worse", final.get_attribute("data-decision")
    assert final.get_attribute("data-records") == str(ARGS["records_used"]), final.get_attribute("data-records")
    num = lambda e, a: float(e.get_attribute(a))
    zero = one(d, "#sequential-forest line.zero")
    ci = final.find_element(By.CSS_SELECTOR, "line.interval")
    assert num(ci, "x1") <= num(ci, "x2") < num(zero, "x1"), "model-b is worse: its final interval below zero"
    assert "Stopped early\nyes" in text(d, "#sequential"), text(d, "#sequential")
    shot(d, "report-sequential", 1100, at="#responders-panel")


def check_refinement(d):
    open_report(d, ARGS["refinement"])
    no_console_errors(d, "refinement")
    assert "targeted_refinement" in d.title, d.title
    assert text(d, "#outcome") == "accepted"
    assert text(d, "#sections-changed") == "2"
    assert text(d, "#issues-fixed") == "2", text(d, "#issues-fixed")
    assert text(d, "#issues-unresolved") == "0"
    changed = [a.get_attribute("data-section-id") for a in d.find_elements(By.CSS_SELECTOR, "article.doc-section.changed")]
    assert changed == ["example", "rule72"], changed
    rule72 = one(d, 'article[data-section-id="rule72"]')
    before = rule72.find_element(By.CSS_SELECTOR, ".before-text").text
    after = rule72.find_element(By.CSS_SELECTOR, ".after-text").text
    assert ARGS["triple"] in before and ARGS["triple"] not in after and ARGS["double"] in after, (before, after)
    ends = [e.get_attribute("data-end") for e in rule72.find_elements(By.CSS_SELECTOR, "tr.issue td.end")]
    assert ends == ["fixed"], ends
    assert len(d.find_elements(By.CSS_SELECTOR, "#score-history circle.point")) >= 2
    untouched_sections = d.find_elements(By.CSS_SELECTOR, "article.doc-section:not(.changed)")
    assert len(untouched_sections) == 6, len(untouched_sections)
    shot(d, "report-refinement", 2300)


def check_debate(d):
    open_report(d, ARGS["debate"])
    no_console_errors(d, "debate")
    ids = [r.get_attribute("data-problem-id") for r in d.find_elements(By.CSS_SELECTOR, "#problems tr.problem")]
    assert ids == ARGS["problem_ids"], ids
    shown = d.execute_script(
        "return Array.from(document.querySelectorAll('#problems tr.problem td:first-child')).map((td) => td.textContent)")
    assert shown == ARGS["problem_ids"], shown
    assert text(d, "#accuracy") == "100.0%", text(d, "#accuracy")
    assert len(d.find_elements(By.CSS_SELECTOR, "details.debate-problem")) == 2
    assert d.execute_script("return window.__pwned === undefined && document.images.length === 0")
    d.execute_script("document.querySelector('details.debate-problem').open = true")
    shot(d, "report-debate", 1600)


def check_self_refine(d):
    open_report(d, ARGS["self_refine"])
    no_console_errors(d, "self_refine")
    assert text(d, "#final-text") == ARGS["final_text"], text(d, "#final-text")
    assert len(d.find_elements(By.CSS_SELECTOR, "#passes tr.pass")) >= 1


def check_checklist(d):
    open_report(d, ARGS["checklist"])
    no_console_errors(d, "checklist")
    items = d.find_elements(By.CSS_SELECTOR, "#checklist details.checklist li[data-item-id]")
    assert items, "the checklist's items"
    assert d.execute_script("return document.querySelectorAll('b').length") == 0, "the input's markup is text"


def main():
    d = browser()
    try:
        for name, check in (("eval", check_eval), ("sequential", check_sequential), ("refinement", check_refinement),
                            ("debate", check_debate), ("self_refine", check_self_refine), ("checklist", check_checklist)):
            if name in ARGS:
                check(d)
    finally:
        d.quit()
    if "eval" in ARGS:
        check_eval_without_script()
    print("OK", flush=True)


if __name__ == "__main__":
    main()
