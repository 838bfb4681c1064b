#!/usr/bin/env python3
"""Browser checks of the gateway's admin page in headless Chromium (chromedriver from the Debian
packages), driven by the Rust tests in tests/tests/admin.rs and tests/tests/targeted_refinement.rs.

Usage: admin_page.py <mode> '<json args>'. Modes:
  refinement  a best-effort run (banner, sparkline), an escalated run (plan panel by batch, Mark as
              reviewed), a running run (Intervene -> edit section 3 -> Resume -> the delta judge's
              verification of the human edit appears), phone width.
  checklist   the auth prompt blocks everything without the token; a checklist evaluation's
              progress reaches 100% live without a reload; hostile record ids and checklist
              questions render as characters and never run; the records table is paged
              (ListRunResults): opened as `#/runs/<id>?page_size=N` with N = args["page_size"]
              (default total - 1, so a small run has two pages), the first page's rows, Next to
              the second, Previous back, "records X–Y of <total>".
  views       a debate's problems with their answers and stage artifacts; a self-refine run's
              passes and final text; the event log's line of every event kind, those no run here
              makes included (a spread run's records_claimed), fed to the page's own module.
With args["token"] in refinement and views, the page is first opened as the gateway prints it,
`<url>/#token=<token>` (a token generated at start): it keeps the token and drops it from the URL.
Prints READY (the Rust side then releases the backend) where a mode needs it, and OK at the end;
any failed check raises. Screenshots go to args["shots"].
"""

import json
import os
import sys
import urllib.error
import urllib.request
from collections import defaultdict

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

WAIT = 30


def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1280,1000", "--lang=en-US"):
        opts.add_argument(a)
    service = Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"))
    return webdriver.Chrome(service=service, options=opts)


def api(args, method, body):
    req = urllib.request.Request(f"{args['url']}/api/{method}", data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    if args.get("token"):
        req.add_header("Authorization", f"Bearer {args['token']}")
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


def wait(d, what, cond, timeout=WAIT):
    try:
        return WebDriverWait(d, timeout).until(lambda d: cond(d))
    except Exception as e:
        shot(d, {"shots": ARGS.get("shots")}, "failure-" + what.replace(" ", "-"))
        raise AssertionError(f"timed out waiting for {what}") from e


def shot(d, args, name):
    if args.get("shots"):
        os.makedirs(args["shots"], exist_ok=True)
        d.save_screenshot(os.path.join(args["shots"], f"{name}.png"))


def one(d, css):
    found = d.find_elements(By.CSS_SELECTOR, css)
    return found[0] if found else None


def shown(d, css):
    e = one(d, css)
    return e is not None and e.is_displayed()


def open_run(d, args, run_id, query=""):
    """Open `#/runs/<id>` (`query`, e.g. "?page_size=3": the rows per page of a checklist
    evaluation's records table)."""
    d.get(f"{args['url']}/#/runs/{run_id}{query}")
    wait(d, f"run {run_id}", lambda d: one(d, f'#run[data-run-id="{run_id}"]'))


def state(d):
    e = one(d, "#run")
    return e.get_attribute("data-state") if e else None


def control(d, button, reason):
    reason_box = one(d, "#reason")
    reason_box.clear()
    reason_box.send_keys(reason)
    wait(d, f"{button} enabled", lambda d: one(d, button).is_enabled())
    one(d, button).click()


def login(d, args):
    """Open the URL the gateway prints (`#token=...`): no prompt, and the token leaves the URL."""
    if not args.get("token"):
        return
    d.get(f"{args['url']}/#token={args['token']}")
    wait(d, "the page opened with the token", lambda d: shown(d, "#app"))
    assert not shown(d, "#auth"), "the token from the URL is used: no prompt"
    assert "token" not in d.current_url, f"the token is dropped from the URL: {d.current_url}"


def refinement(d, args):
    login(d, args)
    d.get(args["url"] + "/")
    wait(d, "the runs list", lambda d: len(d.find_elements(By.CSS_SELECTOR, "#runs tbody tr[data-run-id]")) >= 3)
    assert not shown(d, "#auth"), "the token is held for the tab: no prompt"
    shot(d, args, "runs-list")

    # A best-effort result: the banner with the quality and the hints, one sparkline point per score.
    best = args["best_effort"]
    result = api(args, "GetRun", {"runId": best})["run"]["result"]["targetedRefinement"]
    open_run(d, args, best)
    wait(d, "the best-effort banner", lambda d: shown(d, "#banner-best-effort"))
    hints = [h.text for h in d.find_elements(By.CSS_SELECTOR, "#banner-best-effort li.hint")]
    assert hints == result["improvementHints"], (hints, result["improvementHints"])
    assert one(d, "#banner-best-effort .quality").text.strip(), "the quality status is shown"
    points = d.find_elements(By.CSS_SELECTOR, "#sparkline circle.point")
    assert len(points) == len(result["scoreHistory"]), (len(points), result["scoreHistory"])
    shot(d, args, "refinement-best-effort")

    # An escalated run: the plan panel lists the tasks by batch; Mark as reviewed closes it.
    escalated = args["escalated"]
    run = api(args, "GetRun", {"runId": escalated})["run"]
    by_batch = defaultdict(list)
    for t in run["refinement"]["tasks"]:
        by_batch[str(t["batchIndex"])].append(t["task"]["sectionId"])
    assert by_batch, "the escalated run has a plan"
    open_run(d, args, escalated)
    wait(d, "the plan panel", lambda d: d.find_elements(By.CSS_SELECTOR, "#plan .batch .task"))
    shown_batches = {}
    for b in d.find_elements(By.CSS_SELECTOR, "#plan .batch"):
        shown_batches[b.get_attribute("data-batch")] = [
            t.get_attribute("data-section-id") for t in b.find_elements(By.CSS_SELECTOR, ".task")]
    assert shown_batches == dict(by_batch), (shown_batches, dict(by_batch))
    points = d.find_elements(By.CSS_SELECTOR, "#sparkline circle.point")
    assert len(points) == len(run["refinement"]["scoreHistory"]), len(points)
    assert state(d) == "RUN_STATE_AWAITING_HUMAN"
    assert not one(d, "#btn-pause").is_enabled(), "pause does not apply to an escalated run"
    shot(d, args, "refinement-escalated")
    d.set_window_size(1280, 3000)
    shot(d, args, "refinement-escalated-full")
    d.set_window_size(1280, 1000)
    control(d, "#btn-review", "Reviewed in the browser")
    wait(d, "the reviewed outcome", lambda d: state(d) == "RUN_STATE_SUCCEEDED"
         and "REVIEWED" in (one(d, "#outcome").get_attribute("textContent") or "").upper())
    assert all(not one(d, b).is_enabled() for b in ("#btn-pause", "#btn-resume", "#btn-cancel", "#btn-review"))

    # A running run: Intervene -> edit section 3 -> Resume -> the human edit is verified.
    running = args["running"]
    open_run(d, args, running)
    wait(d, "a running run", lambda d: state(d) == "RUN_STATE_RUNNING")
    assert not one(d, "#btn-edit").is_enabled(), "no edit while running"
    control(d, "#btn-intervene", "Intervene on the example")
    wait(d, "the pause", lambda d: state(d) == "RUN_STATE_PAUSED")
    section = Select(one(d, "#edit-section"))
    section.select_by_index(2)
    assert section.first_selected_option.get_attribute("value") == args["edit_section"]
    content = one(d, "#edit-content")
    # A refused control shows the gateway's error, field named.
    content.clear()
    content.send_keys("   ")
    control(d, "#btn-edit", "blank on purpose")
    wait(d, "the refusal of a blank edit", lambda d: "edit_section.content" in one(d, "#control-error").text)
    assert "INVALID_ARGUMENT" in one(d, "#control-error").text, one(d, "#control-error").text
    content.clear()
    content.send_keys(args["edit_content"])
    control(d, "#btn-edit", "Rewrote the opening sentence")
    wait(d, "the edit in the audit log",
         lambda d: any("edit_section" in e.text for e in d.find_elements(By.CSS_SELECTOR, "#audit .audit-entry")))
    assert not one(d, "#control-error").text.strip(), one(d, "#control-error").text
    control(d, "#btn-resume", "Go on")
    wait(d, "the verification of the human edit", lambda d: d.find_elements(
        By.CSS_SELECTOR, '#events .event.human-edit[data-kind="verification_result"]'))
    shot(d, args, "refinement-human-edit")

    # Phone width: the list still fits and opens a run.
    d.set_window_size(390, 844)
    d.get(args["url"] + "/")
    wait(d, "the list at phone width", lambda d: shown(d, "#runs"))
    shot(d, args, "runs-list-phone")


def checklist(d, args):
    d.get(args["url"] + "/")
    wait(d, "the token prompt", lambda d: shown(d, "#auth"))
    assert not shown(d, "#app"), "nothing but the prompt without the token"
    status = d.execute_async_script(
        "const done = arguments[0];"
        "fetch('/api/ListRuns', {method: 'POST', headers: {'Content-Type': 'application/json'}, body: '{}'})"
        ".then(r => done(r.status), () => done(-1));")
    assert status == 401, f"the API refuses a call without the token: {status}"
    one(d, "#token").send_keys("wrong-token")
    one(d, "#token-submit").click()
    wait(d, "the refusal of a wrong token", lambda d: shown(d, "#auth") and one(d, "#auth-error").text.strip())
    assert not shown(d, "#app")
    shot(d, args, "auth-prompt")
    token = one(d, "#token")
    token.clear()
    token.send_keys(args["token"])
    one(d, "#token-submit").click()
    wait(d, "the runs list", lambda d: shown(d, "#app") and one(d, f'#runs tr[data-run-id="{args["run_id"]}"]'))

    total = args["total"]
    size = args.get("page_size") or max(1, total - 1)
    open_run(d, args, args["run_id"], f"?page_size={size}")
    d.execute_script("window.__loaded_once = true;")
    wait(d, "the progress bar", lambda d: one(d, "#records-bar"))
    print("READY", flush=True)
    wait(d, "100% without a reload", lambda d: one(d, "#records-bar").get_attribute("value") == str(total)
         and one(d, "#records-bar").get_attribute("max") == str(total))
    wait(d, "the run's end", lambda d: state(d) == "RUN_STATE_SUCCEEDED")
    assert d.execute_script("return window.__loaded_once === true;"), "the page was reloaded"
    assert one(d, "#records-progress").text.strip().startswith(f"{total}/{total}"), one(d, "#records-progress").text
    assert one(d, "#aggregates").text.strip(), "the aggregates are shown"

    # Untrusted text is shown as characters and never runs.
    # (textContent: some of it sits in collapsed <details>; parsed markup would lose its tags.)
    text = d.execute_script("return document.getElementById('app').textContent;")
    for hostile in args["hostile"]:
        assert hostile in text, f"{hostile!r} is shown as text"
    assert d.execute_script("return window.__xss === undefined;"), "injected markup ran"
    assert not d.find_elements(By.CSS_SELECTOR, "#app img[src='x'], #app script:not([src])"), "markup was parsed"
    shot(d, args, "checklist-eval")
    records_pages(d, args, size)

    # The finished run is deleted from its page (after the confirmation), the list no longer has
    # it, and its address now says NOT_FOUND.
    assert not one(d, "#btn-cancel").is_enabled(), "nothing to cancel once finished"
    wait(d, "delete enabled once finished", lambda d: one(d, "#btn-delete").is_enabled())
    d.execute_script("window.confirm = () => true;")
    one(d, "#btn-delete").click()
    run_row = f'#runs tr[data-run-id="{args["run_id"]}"]'
    wait(d, "the list without the deleted run", lambda d: shown(d, "#runs") and not one(d, run_row))
    d.get(f"{args['url']}/#/runs/{args['run_id']}")
    d.refresh()
    wait(d, "NOT_FOUND for the deleted run", lambda d: "NOT_FOUND" in d.find_element(By.TAG_NAME, "body").text)


def record_rows(d):
    """(index, record id, primary score cell) of each row of the records table shown."""
    return [(r.get_attribute("data-index"), r.get_attribute("data-record-id"),
             r.find_elements(By.CSS_SELECTOR, "td")[2].get_attribute("textContent").strip())
            for r in d.find_elements(By.CSS_SELECTOR, "#records tr.record")]


def records_range(d):
    e = one(d, "#records-range")
    return {k: e.get_attribute(f"data-{k}") for k in ("page", "first", "last", "total")} | {"text": e.text}


def records_pages(d, args, size):
    """The finished run's records table pages with ListRunResults: `size` rows a page."""
    total = args["total"]
    assert total > size, f"two pages at least: {total} records, {size} a page"
    pages, token = [], ""
    while True:
        page = api(args, "ListRunResults", {"runId": args["run_id"], "pageSize": size, "pageToken": token})
        assert int(page["recordsTotal"]) == total, page
        pages.append([(str(r.get("index", 0)), r["recordId"],
                       f"{r['score'].get('primaryScore', 0):.3f}" if r.get("score") else r.get("error") or "no score")
                      for r in page.get("results", [])])
        token = page.get("nextPageToken", "")
        if not token:
            break
    assert [len(p) for p in pages[:-1]] == [size] * (len(pages) - 1) and pages[-1], pages
    assert sum(len(p) for p in pages) == total, pages

    def on_page(n):
        first = n * size + 1
        last = n * size + len(pages[n])
        wait(d, f"records page {n + 1}", lambda d: records_range(d)["page"] == str(n) and record_rows(d) == pages[n])
        r = records_range(d)
        assert (r["first"], r["last"], r["total"]) == (str(first), str(last), str(total)), r
        assert r["text"].replace("-", "–").startswith(f"records {first}–{last} of {total}"), r["text"]
        assert one(d, "#records-prev").is_enabled() == (n > 0), "Previous only after the first page"
        assert one(d, "#records-next").is_enabled() == (n + 1 < len(pages)), "Next only before the last page"

    assert not shown(d, "#records-open"), "a run that is not open does not say it takes records"
    on_page(0)
    for n in range(1, len(pages)):
        one(d, "#records-next").click()
        on_page(n)
    shot(d, args, "checklist-eval-records-last-page")
    one(d, "#records-prev").click()
    on_page(len(pages) - 2)


def views(d, args):
    login(d, args)
    open_run(d, args, args["debate"])
    wait(d, "the debate's problems", lambda d: len(d.find_elements(By.CSS_SELECTOR, "#debate .problem")) == 2)
    for pid in args["problems"]:
        problem = one(d, f'#debate .problem[data-problem-id="{pid}"]')
        assert problem is not None, pid
        answer = problem.find_element(By.CSS_SELECTOR, ".final-answer").get_attribute("textContent")
        assert args["answer"] in answer, (pid, answer)
        artifacts = problem.get_attribute("textContent")
        assert "6 * 7 = 42" in artifacts, f"{pid}: the solvers' steps are shown"
    assert state(d) == "RUN_STATE_SUCCEEDED"
    shot(d, args, "debate")

    open_run(d, args, args["self_refine"])
    wait(d, "the passes", lambda d: d.find_elements(By.CSS_SELECTOR, "#passes .pass"))
    passes = d.find_elements(By.CSS_SELECTOR, "#passes .pass")
    assert len(passes) == 1, len(passes)
    assert "Say what the answer means." in passes[0].get_attribute("textContent")
    wait(d, "the final text", lambda d: one(d, "#final-text").get_attribute("textContent").strip() == args["final_text"])
    shot(d, args, "self-refine")
    event_lines(d)


def logged(d, events):
    """{sequence: (data-kind, summary)} of `events` (RunEvents in the proto3 JSON mapping) as the
    page's event log shows them (detail/events.js, the module the page runs)."""
    got = d.execute_async_script(
        "const [events, done] = arguments;"
        "import('/js/detail/events.js').then((m) => {"
        "  const D = {els: {events: document.createElement('ul'), eventsMeta: document.createElement('p')},"
        "             pendingLog: events.slice(), eventCount: events.length};"
        "  m.flushEventLog(D);"
        "  done([...D.els.events.children].map((li) =>"
        "    [li.dataset.seq, li.dataset.kind, li.querySelector('.summary').textContent]));"
        "}, (e) => done(String(e)));", events)
    assert isinstance(got, list), f"the event log module: {got}"
    return {seq: (kind, summary) for seq, kind, summary in got}


def event_lines(d):
    """A chunk claim of a run spread over gateways (records_claimed, PostgreSQL stores only) is a
    line of its own, not "unknown event"; a member the page does not know still is."""
    lines = logged(d, [
        {"sequence": "7", "recordsClaimed": {"gateway": "gw-a", "count": 1024}},
        {"sequence": "8", "recordsClaimed": {"gateway": "gw-b", "first": "1024", "count": 1024, "takeover": True}},
        {"sequence": "9", "notInTheContract": {}},
    ])
    assert lines["7"] == ("recordsClaimed", "records 0–1023 claimed by gateway gw-a"), lines
    assert lines["8"] == ("recordsClaimed",
                          "records 1024–2047 claimed by gateway gw-b (taken over from an expired claim)"), lines
    assert lines["9"] == ("unknown", "unknown event"), lines


ARGS = {}


def main():
    global ARGS
    mode, ARGS = sys.argv[1], json.loads(sys.argv[2])
    d = browser()
    try:
        {"refinement": refinement, "checklist": checklist, "views": views}[mode](d, ARGS)
    finally:
        logs = []
        try:
            logs = [e for e in d.get_log("browser") if e.get("level") == "SEVERE"]
        except Exception:
            pass
        for e in logs:
            print("browser console:", e.get("message"), file=sys.stderr)
        d.quit()
    print("OK", flush=True)


if __name__ == "__main__":
    main()
