/*
 * Assay admin page, run detail ("#/runs/<id>"): a GetRun snapshot, then the run's events live; the
 * frame every pipeline shares (title, state, notice, outcome, controls, audit and event logs) and
 * the panels of its pipeline kind (one module each under detail/).
 */

import {AWAITING, PAUSED, REFINEMENT, REFRESH_DEBOUNCE_MS, RENDER_DELAY_MS, TERMINAL} from '../constants.js';
import {enumLabel, fmtPct, fmtScore, kindLabel, num, plural, tokensOf} from '../format.js';
import {api, errorNodes} from '../api.js';
import {buildControls, updateControls} from '../human.js';
import {app, els} from '../page.js';
import {badge, h, panel, patch, timeEl} from '../render.js';
import {buildChecklistEval, buildGenerate, renderChecklistEval, renderGenerate} from './checklist_eval.js';
import {buildDebate, renderDebate} from './debate.js';
import {flushEventLog, renderAudit} from './events.js';
import {applyLive, classify, gather, newDetail} from './model.js';
import {buildSelfRefine, renderSelfRefine} from './self_refine.js';
import {setStream, watch} from './stream.js';
import {buildRefinement, renderRefinement} from './targeted_refinement.js';

/**
 * Open run `id`: its snapshot, then its events live, until the view is torn down (app.view
 * changes). `pageSize`: rows per page of a checklist evaluation's records (0: the default).
 */
export async function openRun(id, pageSize = 0) {
  els.listView.hidden = true;
  els.detailView.hidden = false;
  window.scrollTo(0, 0);
  const D = newDetail(id, pageSize);
  app.view = D;
  document.title = `Run ${id} · Assay admin`;
  const back = () => h('a', {id: 'back', class: 'back', href: '#/'}, '← All runs');
  els.detailView.replaceChildren(back(), h('p', {class: 'muted'}, 'Loading run ', h('code', id), '…'));
  let res;
  try {
    res = await api('GetRun', {runId: id});
  } catch (err) {
    if (app.view !== D || err.unauthorized) return;
    els.detailView.replaceChildren(back(), h('h2', 'Run ', h('code', id)),
      h('div', {class: 'error', role: 'alert'}, errorNodes(err)));
    return;
  }
  if (app.view !== D) return;
  if (!res.run) {
    els.detailView.replaceChildren(back(), h('p', {class: 'error', role: 'alert'}, 'GetRun returned no run.'));
    return;
  }
  D.kind = res.run.kind || '';
  buildDetail(D, res.run);
  setSnapshot(D, res.run);
  renderDetail(D);
  D.els.title.focus();
  watch(D, onEvent);
}

function setSnapshot(D, run) {
  if (D.run && num(run.lastSequence) < D.snapSeq) return; // an older answer overtaken by a newer one
  D.run = run;
  D.snapSeq = num(run.lastSequence);
  D.liveEvents = D.liveEvents.filter((ev) => num(ev.sequence) > D.snapSeq);
  for (const ev of D.liveEvents) applyLive(D, ev);
  scheduleRender(D);
}

function scheduleRefresh(D, delay = REFRESH_DEBOUNCE_MS) {
  clearTimeout(D.refreshTimer);
  D.refreshTimer = setTimeout(async () => {
    if (app.view !== D) return;
    try {
      const res = await api('GetRun', {runId: D.id});
      if (app.view === D && res.run) setSnapshot(D, res.run);
    } catch (err) {
      if (app.view === D && !err.unauthorized) setStream(D, 'error', err);
    }
  }, delay);
}

function scheduleRender(D) {
  if (D.renderTimer) return;
  D.renderTimer = setTimeout(() => {
    D.renderTimer = 0;
    if (app.view === D) renderDetail(D);
  }, RENDER_DELAY_MS);
}

function onEvent(D, ev) {
  const seq = num(ev.sequence);
  if (seq && seq <= D.lastSeq) return; // already seen (replayed after a reconnect)
  if (seq) D.lastSeq = seq;
  const k = classify(ev);
  gather(D, ev, k);
  if (seq > D.snapSeq) {
    D.liveEvents.push(ev);
    if (applyLive(D, ev)) scheduleRefresh(D);
  }
  if (k.member === 'completed') D.completed = true;
  D.eventCount += 1;
  D.pendingLog.push(ev);
  scheduleRender(D);
}

/** What a control (human.js) does once the gateway took it: fetch the snapshot again, render. */
const afterControl = {refresh: scheduleRefresh, render: renderDetail};

function buildDetail(D, run) {
  const e = D.els;
  e.title = h('h2', {id: 'run-title', tabindex: '-1'}, run.label || `${kindLabel(run.kind)} run`);
  e.state = h('span', {id: 'run-state'});
  e.meta = h('span', {class: 'run-meta'});
  e.streamStatus = h('span', {id: 'stream-status', class: 'stream'});
  e.notice = h('p', {id: 'notice', class: 'notice', hidden: true});
  e.outcome = h('div', {id: 'outcome', class: 'outcome', role: 'status', hidden: true});
  e.audit = h('ol', {id: 'audit', class: 'audit'});
  e.auditNone = h('p', {class: 'muted'}, 'No control actions recorded yet.');
  e.events = h('ul', {id: 'events', class: 'events'});
  e.eventsMeta = h('p', {class: 'muted'}, 'No events yet.');
  e.root = h('section', {
    id: 'run', 'data-run-id': D.id, 'data-kind': run.kind || '', 'data-state': run.state || '',
    'aria-labelledby': 'run-title',
  },
  h('a', {id: 'back', class: 'back', href: '#/'}, '← All runs'),
  h('header', {class: 'run-head'}, e.title, h('p', {class: 'run-sub'}, e.state, ' ', e.meta, ' ', e.streamStatus)),
  e.notice,
  e.outcome,
  buildControls(D, afterControl),
  kindView(D.kind) ? kindView(D.kind).build(D) : null,
  panel('Audit log', e.audit, e.auditNone),
  panel('Recent events', e.eventsMeta, e.events));
  els.detailView.replaceChildren(e.root);
}

function renderDetail(D) {
  const {run, els: e} = D;
  e.root.dataset.state = run.state || '';
  e.root.dataset.kind = run.kind || '';
  patch(e.state, run.state, () => badge(run.state));
  const tokens = tokensOf(run.usage);
  patch(e.meta, [run.kind, run.runId, run.createdAt, run.updatedAt, tokens], () => [
    kindLabel(run.kind), ' · ', h('code', run.runId || D.id), ' · started ', timeEl(run.createdAt),
    ' · updated ', timeEl(run.updatedAt), ' · ', h('span', {id: 'run-tokens'}, String(tokens)), ' tokens',
  ]);
  renderNotice(D);
  renderOutcome(D);
  updateControls(D);
  const view = kindView(D.kind);
  if (view) view.render(D);
  renderAudit(D);
  flushEventLog(D);
}

/** The panels of each pipeline kind: build once, render on every change. */
function kindView(kind) {
  return {
    [REFINEMENT]: {build: buildRefinement, render: renderRefinement},
    PIPELINE_KIND_CHECKLIST_EVAL: {build: buildChecklistEval, render: renderChecklistEval},
    PIPELINE_KIND_GENERATE_CHECKLIST: {build: buildGenerate, render: renderGenerate},
    PIPELINE_KIND_DEBATE: {build: buildDebate, render: renderDebate},
    PIPELINE_KIND_SELF_REFINE: {build: buildSelfRefine, render: renderSelfRefine},
  }[kind] || null;
}

function renderNotice(D) {
  const {run, els: e} = D;
  let text = '';
  if (run.state === AWAITING) {
    const esc = D.escalation;
    text = 'Waiting for a human decision'
      + (esc ? `: ${esc.reason} (best score ${fmtScore(esc.bestScore)} at iteration ${num(esc.bestIteration)})` : '.')
      + ' Edit a section, accept the current content, mark it as reviewed, or resume.';
  } else if (run.state === PAUSED) {
    text = D.kind === REFINEMENT
      ? 'Paused. Edit a section, accept the current content, or resume.'
      : 'Paused. Resume or cancel the run.';
  }
  e.notice.textContent = text;
  e.notice.hidden = !text;
}

function renderOutcome(D) {
  const {run, els: e} = D;
  const finished = TERMINAL.has(run.state);
  e.outcome.hidden = !finished;
  const result = run.result || {};
  const tr = result.targetedRefinement;
  e.outcome.dataset.state = finished ? run.state : '';
  e.outcome.dataset.outcome = tr ? tr.outcome || '' : '';
  patch(e.outcome, finished ? [run.state, result] : null, () => {
    if (!finished) return [];
    const lines = [h('p', h('strong', 'Finished: '), badge(run.state))];
    if (tr) {
      lines.push(h('p', 'Outcome: ', h('strong', {class: 'outcome-name'}, enumLabel(tr.outcome, 'REFINEMENT_OUTCOME_')),
        ' ', h('code', {class: 'enum'}, tr.outcome || ''),
        ` · final score ${fmtScore(tr.finalScore)} after ${plural(num(tr.iterations), 'iteration')}`,
        ` · quality ${enumLabel(tr.quality, 'QUALITY_STATUS_')}`));
      if (tr.stopReason) lines.push(h('p', 'Stopped: ', tr.stopReason));
      if (tr.warning) lines.push(h('p', {class: 'warn-text'}, 'Warning: ', tr.warning));
    } else if (result.debate) {
      const d = result.debate;
      lines.push(h('p', `${num(d.problemsTotal)} problems, ${num(d.problemsFailed)} failed · accuracy ${fmtPct(d.accuracy)}`
        + (d.accuracyAll != null ? ` (graded) · ${fmtPct(d.accuracyAll)} over all problems, failed counted wrong` : '')));
    } else if (result.checklistEval) {
      const r = result.checklistEval;
      // an open run's result carries no record results (resultsPaged): the run counts them
      const records = Math.max(num(run.recordsTotal), (r.results || []).length);
      lines.push(h('p', `${plural(records, 'record')} · mean primary score ${fmtScore(r.aggregate && r.aggregate.meanPrimaryScore)}`));
    } else if (result.selfRefine) {
      lines.push(h('p', `Stopped: ${enumLabel(result.selfRefine.stopReason, 'SELF_REFINE_STOP_REASON_')}`));
    }
    if (result.error) lines.push(h('p', {class: 'error-text'}, 'Error: ', result.error));
    return lines;
  });
}
