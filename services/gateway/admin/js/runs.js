/*
 * Assay admin page: the runs list ("#/"), refreshed every 2 s while it and the tab are visible.
 */

import {LIST_REFRESH_MS} from './constants.js';
import {kindLabel, num, plural, tokensOf} from './format.js';
import {api, errorNodes} from './api.js';
import {els} from './page.js';
import {badge, h, patch, timeEl} from './render.js';

/** The list view: whether it is shown, its refresh timer, its rows by run id, where the reader was. */
export const list = {active: false, timer: 0, gen: 0, rows: new Map(), lastOpened: '', focusOnLoad: false, scrollY: 0};

/** Show the runs list and start its refresh. */
export function openList() {
  els.listView.hidden = false;
  els.detailView.hidden = true;
  els.detailView.replaceChildren();
  document.title = 'Runs · Assay admin';
  list.active = true;
  list.focusOnLoad = Boolean(list.lastOpened);
  loadRuns();
}

/** ListRuns with the filters, into the table; then the next refresh. */
export async function loadRuns() {
  clearTimeout(list.timer);
  if (!list.active) return;
  const gen = ++list.gen;
  const request = {pageSize: 200};
  if (els.filterState.value) request.state = els.filterState.value;
  if (els.filterKind.value) request.kind = els.filterKind.value;
  try {
    const res = await api('ListRuns', request);
    if (!list.active || gen !== list.gen) return;
    renderRuns(res.runs || [], Boolean(res.nextPageToken));
    patch(els.listError, null, () => []);
  } catch (err) {
    if (err.unauthorized || !list.active || gen !== list.gen) return;
    // patched, so a failure repeated every 2 s is announced once
    patch(els.listError, [err.code, err.message, err.fieldViolations], () => errorNodes(err));
  }
  scheduleListRefresh();
}

/** The only periodic call: ListRuns every 2 s while the list and the tab are visible. */
function scheduleListRefresh() {
  clearTimeout(list.timer);
  if (list.active && document.visibilityState === 'visible') list.timer = setTimeout(loadRuns, LIST_REFRESH_MS);
}

function renderRuns(runs, more) {
  const tbody = els.runsBody;
  const empty = tbody.querySelector('tr.empty');
  if (empty) empty.remove();
  const seen = new Set();
  runs.forEach((run, i) => {
    let tr = list.rows.get(run.runId);
    if (!tr) {
      tr = h('tr', {tabindex: '0', 'data-run-id': run.runId},
        h('td', {class: 'run'}), h('td', {class: 'kind'}), h('td', {class: 'state'}),
        h('td', {class: 'progress'}), h('td', {class: 'started'}), h('td', {class: 'tokens num'}));
      list.rows.set(run.runId, tr);
    }
    updateRunRow(tr, run);
    seen.add(run.runId);
    // Move rows only when out of place, so a focused row keeps its focus.
    if (tbody.children[i] !== tr) tbody.insertBefore(tr, tbody.children[i] || null);
  });
  for (const [id, tr] of list.rows) {
    if (!seen.has(id)) {
      tr.remove();
      list.rows.delete(id);
    }
  }
  if (!runs.length) {
    tbody.append(h('tr', {class: 'empty'}, h('td', {colspan: '6'}, 'No runs match these filters.')));
  }
  const comparable = runs.filter((r) => r.kind === 'PIPELINE_KIND_CHECKLIST_EVAL'
    && (r.state === 'RUN_STATE_SUCCEEDED' || r.state === 'RUN_STATE_PARTIAL'));
  patch(els.evalRuns, comparable.map((r) => [r.runId, r.label]), () => comparable.map((r) =>
    h('option', {value: r.runId}, r.label ? `${r.label} · ${r.runId}` : r.runId)));
  const when = new Date().toLocaleTimeString();
  els.listMeta.textContent = `${plural(runs.length, 'run')}${more ? ' (the newest 200)' : ''} · updated ${when}`;
  if (list.focusOnLoad) {
    // back from a run: where the reader was, on the row they opened
    list.focusOnLoad = false;
    window.scrollTo(0, list.scrollY);
    const row = list.rows.get(list.lastOpened);
    if (row && (document.activeElement === document.body || !document.activeElement)) row.focus({preventScroll: true});
  }
}

function updateRunRow(tr, run) {
  tr.dataset.kind = run.kind || '';
  tr.dataset.state = run.state || '';
  const [cRun, cKind, cState, cProgress, cStarted, cTokens] = tr.cells;
  patch(cRun, [run.label, run.runId], () => [
    run.label ? h('span', {class: 'label'}, run.label) : null, h('code', {class: 'id'}, run.runId),
  ]);
  cKind.textContent = kindLabel(run.kind);
  patch(cState, run.state, () => badge(run.state));
  cProgress.textContent = listProgress(run);
  patch(cStarted, run.createdAt, () => timeEl(run.createdAt));
  cTokens.textContent = String(tokensOf(run.usage));
}

function listProgress(run) {
  const p = run.refinement;
  if (p) return `iteration ${num(p.iteration)}/${num(p.maxIterations)}${p.phase ? ` · ${p.phase}` : ''}`;
  const total = num(run.recordsTotal);
  const open = run.open ? ' · open' : ''; // an open run still takes records: its total grows
  return total > 0 ? `${num(run.recordsDone)}/${total}${open}` : open ? 'open' : '—';
}

/** Open the run of a row (remembered, to focus it again when the reader comes back). */
export function openRowRun(tr) {
  list.lastOpened = tr.dataset.runId;
  location.hash = `#/runs/${encodeURIComponent(tr.dataset.runId)}`;
}
