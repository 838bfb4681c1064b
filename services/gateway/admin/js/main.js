/*
 * Assay admin page: the entry module (index.html loads it with <script type="module">; every other
 * module is imported from here, no bundler, no build step, no dependencies).
 *
 * The page talks to the gateway's HTTP face of GatewayService (same origin):
 *   GET  /api/config                     -> {authRequired}
 *   POST /api/ListRuns|GetRun|ControlRun|CompareRuns|DeleteRun|ListRunResults -> proto3 JSON in and out
 *                                        (64-bit integers as strings)
 *   GET  /api/WatchRun?run_id&after_sequence -> server-sent events, one RunEvent per message
 * with `Authorization: Bearer <token>` on every call when a token is held (sessionStorage). The
 * token comes from the URL the gateway prints (`/#token=...`, read once at start and dropped from
 * the address bar and history) or from the token prompt.
 *
 * Views (hash routing, here): "#/" lists every run, refreshed every 2 s while visible (runs.js);
 * "#/runs/<id>" shows one run: a GetRun snapshot, then its events from sequence 0 over one streamed
 * fetch (reconnecting after 1 s from the last sequence seen), with a debounced GetRun after events
 * that change what only the snapshot holds (tasks, sections, state) (detail/run.js, one module per
 * pipeline kind under detail/, the controls in human.js), a checklist evaluation's records a page
 * at a time (ListRunResults; "#/runs/<id>?page_size=N" sets the rows per page).
 * "#/compare/<baseline>/<candidate>" compares two checklist evaluations (compare.js).
 *
 * Safety: data (run labels, model output, record text, errors) only ever reaches the page through
 * textContent, createElement, setAttribute and form values: never through HTML parsing.
 */

import {KINDS, RUN_STATES, TOKEN_KEY} from './constants.js';
import {kindLabel, stateLabel} from './format.js';
import {getToken, sleep} from './api.js';
import {compare, compareHash, openCompare} from './compare.js';
import {openRun} from './detail/run.js';
import {app, els, onTokenRequired, setStatus} from './page.js';
import {list, loadRuns, openList, openRowRun} from './runs.js';

// ---------------------------------------------------------------- routing

/** The view the location's hash names. */
function parseRoute() {
  const c = /^#\/compare\/([^/?#]+)\/([^/?#]+)/.exec(location.hash);
  if (c) {
    try {
      return {name: 'compare', baseline: decodeURIComponent(c[1]), candidate: decodeURIComponent(c[2])};
    } catch { /* malformed escape: fall back to the list */ }
  }
  // "#/runs/<id>?page_size=N": N rows per page of a checklist evaluation's records (the tests use
  // a small N to page a small run); absent or not in 1..RESULTS_PAGE_MAX, the default.
  const m = /^#\/runs\/([^/?#]+)(?:\?([^#]*))?/.exec(location.hash);
  if (m) {
    try {
      const pageSize = Number(new URLSearchParams(m[2] || '').get('page_size')) || 0;
      return {name: 'run', id: decodeURIComponent(m[1]), pageSize};
    } catch { /* malformed escape: fall back to the list */ }
  }
  return {name: 'list'};
}

/** Open the view the hash names, after stopping the current one. */
function route() {
  teardownView();
  const r = parseRoute();
  if (r.name === 'compare') openCompare(r.baseline, r.candidate);
  else if (r.name === 'run') openRun(r.id, r.pageSize);
  else openList();
}

/** Stop whatever the current view runs: the list's timer, a run's stream and timers. */
function teardownView() {
  if (list.active) list.scrollY = window.scrollY;
  list.active = false;
  clearTimeout(list.timer);
  compare.gen += 1;
  els.compareView.hidden = true;
  els.compareView.replaceChildren();
  const D = app.view;
  if (D) {
    D.closed = true;
    D.abort.abort();
    clearTimeout(D.refreshTimer);
    clearTimeout(D.renderTimer);
    if (D.results) clearTimeout(D.results.timer);
  }
  app.view = null;
}

/** Show only the token prompt: drop the token (it was refused or is missing) and every view. */
function requireToken(refused) {
  const had = Boolean(getToken());
  try {
    sessionStorage.removeItem(TOKEN_KEY);
  } catch { /* storage unavailable */ }
  teardownView();
  list.rows.clear();
  els.runsBody.replaceChildren();
  els.detailView.replaceChildren();
  app.revealed = false;
  els.app.hidden = true;
  els.auth.hidden = false;
  els.authError.textContent = refused && had ? 'The server refused this token (401). Enter a valid one.' : '';
  setStatus('');
  els.token.focus();
}

// ---------------------------------------------------------------- start

/** The page's fixed elements into `els`, and their handlers (no inline handler: the CSP allows none). */
function wire() {
  for (const id of ['app', 'auth', 'token', 'status', 'list-view', 'detail-view', 'filter-state', 'filter-kind',
    'list-error', 'list-meta', 'runs', 'auth-error', 'btn-logout', 'compare-view', 'compare-form',
    'compare-baseline', 'compare-candidate', 'compare-form-error', 'eval-runs']) {
    els[id.replace(/-([a-z])/g, (_, c) => c.toUpperCase())] = document.getElementById(id);
  }
  els.logout = els.btnLogout;
  els.runsBody = els.runs.tBodies[0];

  for (const st of RUN_STATES) els.filterState.append(new Option(stateLabel(st), st));
  for (const k of KINDS) els.filterKind.append(new Option(kindLabel(k), k));
  els.filterState.addEventListener('change', loadRuns);
  els.filterKind.addEventListener('change', loadRuns);
  els.compareForm.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const baseline = els.compareBaseline.value.trim();
    const candidate = els.compareCandidate.value.trim();
    if (!baseline || !candidate) {
      els.compareFormError.textContent = 'Give a baseline and a candidate run id.';
      return;
    }
    els.compareFormError.textContent = '';
    location.hash = compareHash(baseline, candidate);
  });

  els.runsBody.addEventListener('click', (ev) => {
    const tr = ev.target.closest('tr[data-run-id]');
    if (tr) openRowRun(tr);
  });
  els.runsBody.addEventListener('keydown', (ev) => {
    const tr = ev.target.closest('tr[data-run-id]');
    if (!tr || ev.target !== tr) return;
    if (ev.key === 'Enter' || ev.key === ' ') {
      ev.preventDefault();
      openRowRun(tr);
    } else if (ev.key === 'ArrowDown' || ev.key === 'ArrowUp') {
      const next = ev.key === 'ArrowDown' ? tr.nextElementSibling : tr.previousElementSibling;
      if (next && next.dataset.runId) {
        ev.preventDefault();
        next.focus();
      }
    }
  });

  els.auth.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const token = els.token.value.trim();
    if (!token) {
      els.authError.textContent = 'Enter the token.';
      return;
    }
    try {
      sessionStorage.setItem(TOKEN_KEY, token);
    } catch {
      els.authError.textContent = 'This browser does not allow session storage; the token cannot be kept.';
      return;
    }
    els.token.value = '';
    els.authError.textContent = '';
    setStatus('Checking the token…');
    route();
  });
  els.logout.addEventListener('click', () => requireToken(false));

  window.addEventListener('hashchange', () => {
    if (!els.auth.hidden) return; // the token prompt stays until a call succeeds
    route();
  });
  document.addEventListener('visibilitychange', () => {
    if (!list.active) return;
    if (document.visibilityState === 'visible') loadRuns();
    else clearTimeout(list.timer);
  });
}

/** A token handed over in the URL fragment (`#token=...`): keep it for this tab, drop it from the URL. */
function takeFragmentToken() {
  const m = /^#token=([^&]*)/.exec(location.hash);
  if (!m) return;
  let token = '';
  try {
    token = decodeURIComponent(m[1]).trim();
  } catch {
    token = '';
  }
  history.replaceState(null, '', `${location.pathname}${location.search}#/`);
  if (!token) return;
  try {
    sessionStorage.setItem(TOKEN_KEY, token);
  } catch { /* storage unavailable: the prompt asks for it */ }
}

async function boot() {
  takeFragmentToken();
  wire();
  let config = null;
  while (!config) {
    try {
      const res = await fetch('/api/config', {cache: 'no-store'});
      if (!res.ok) throw new Error(`HTTP ${res.status}`);
      config = await res.json();
    } catch (err) {
      setStatus(`Cannot load /api/config (${err.message}); retrying…`);
      await sleep(3000);
    }
  }
  setStatus('');
  app.authRequired = Boolean(config.authRequired);
  if (app.authRequired && !getToken()) requireToken(false);
  else route();
}

onTokenRequired(requireToken);
if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', boot);
else boot();
