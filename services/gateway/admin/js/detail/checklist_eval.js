/*
 * Assay admin page, run detail: a checklist evaluation (aggregates, category pass rates, the
 * records' results a page at a time, the checklists) and a checklist generation (the checklist).
 *
 * The records table reads ListRunResults, page by page (Previous / Next, "records X–Y of N"), for
 * every evaluation: an open run's result carries no record results (resultsPaged) and may hold
 * millions, and an inline one is served the same way. While records are being scored the page
 * shown is read again (at most every RESULTS_REFRESH_MS) when the run's progress moved.
 */

import {RESULTS_PAGE_MAX, RESULTS_PAGE_SIZE, RESULTS_REFRESH_MS} from '../constants.js';
import {confLevel, enumLabel, fmtPct, fmtScore, num, plural, tokensOf} from '../format.js';
import {api, errorNodes} from '../api.js';
import {app} from '../page.js';
import {forest, fmtDiff} from '../forest.js';
import {h, kv, panel, patch, table, tag} from '../render.js';
import {buildProgress, renderProgress} from './progress.js';

/** The rows of a page: `D.pageSize` (from the address, `#/runs/<id>?page_size=N`) when valid. */
function pageSizeOf(D) {
  const n = Math.trunc(num(D.pageSize));
  return n >= 1 && n <= RESULTS_PAGE_MAX ? n : RESULTS_PAGE_SIZE;
}

export function buildChecklistEval(D) {
  const e = D.els;
  // The pager: tokens[p] reads page p ('' the first; a page's nextPageToken the next one's);
  // `page` is the page asked for, `shown` the one whose answer `res` is on screen.
  D.results = {
    size: pageSizeOf(D), tokens: [''], page: 0, shown: -1, res: null, error: null,
    version: null, loading: false, timer: 0, gen: 0, lastAt: 0,
  };
  e.aggregates = h('dl', {id: 'aggregates', class: 'kv'});
  e.categories = h('div', {id: 'category-rates'});
  e.gateways = h('div', {id: 'gateway-shares'});
  e.responders = h('div', {id: 'responders'});
  e.recordsRange = h('p', {id: 'records-range', class: 'muted', role: 'status'});
  e.recordsOpen = h('p', {id: 'records-open', class: 'notice', hidden: true}, 'open: still taking records');
  e.records = h('div', {id: 'records'});
  e.recordsError = h('div', {id: 'records-error', class: 'error', role: 'alert'});
  e.recordsPrev = h('button', {type: 'button', id: 'records-prev', onclick: () => goPage(D, D.results.page - 1)},
    '← Previous');
  e.recordsNext = h('button', {type: 'button', id: 'records-next', onclick: () => goPage(D, D.results.page + 1)},
    'Next →');
  e.checklists = h('div', {id: 'checklists'});
  return [
    buildProgress(D, 'Records'),
    panel('Aggregates', e.aggregates, e.categories, e.gateways),
    panel('Responders', e.responders),
    panel('Records', e.recordsOpen, e.recordsRange, e.records,
      h('div', {class: 'pager', role: 'group', 'aria-label': 'Record pages'}, e.recordsPrev, e.recordsNext),
      e.recordsError),
    panel('Checklists', e.checklists),
  ];
}

export function renderChecklistEval(D) {
  const {run, els: e} = D;
  const res = run.result && run.result.checklistEval;
  // An inline result (not resultsPaged) is in the snapshot anyway: its failures count too.
  const inline = (res && !res.resultsPaged && res.results) || [];
  const failed = Math.max(D.recordsFailed, inline.filter((r) => r.error || !r.score).length);
  const done = Math.max(num(run.recordsDone), D.recordsScored, inline.length);
  renderProgress(D, done, recordsTotal(D), failed);

  const agg = (res && res.aggregate) || D.aggregate;
  const u = agg && agg.uncertainty;
  patch(e.aggregates, [agg, res && res.usage], () => (agg ? kv([
    ['Targets', String(num(agg.targets))],
    ['Mean primary score', fmtScore(agg.meanPrimaryScore)],
    [u ? `${confLevel(u.alpha)} interval of the mean` : null,
      u ? h('span', {id: 'mean-ci'}, `[${fmtScore(u.ciLow)}, ${fmtScore(u.ciHigh)}]`) : null],
    ['Macro pass rate', fmtPct(agg.macroPassRate)],
    ['Micro pass rate', fmtPct(agg.microPassRate)],
    ['Unanswered items', String(num(agg.unansweredItems))],
    ['Tokens', res && res.usage ? String(tokensOf(res.usage)) : null],
  ]) : [h('dt', 'Aggregates'), h('dd', 'not yet computed')]));
  const cats = (agg && agg.categoryPassRates) || [];
  patch(e.categories, cats, () => (cats.length ? table(['Category', 'Pass rate', 'Items'], cats.map((c) => h('tr',
    h('td', c.category), h('td', {class: 'num'}, fmtPct(c.passRate)), h('td', {class: 'num'}, String(num(c.items))))), 'categories') : []));

  // A run spread over several gateways: what each claimed and finished.
  const shares = run.gateways || [];
  patch(e.gateways, shares, () => (shares.length ? table(['Gateway', 'Records claimed', 'Records done'],
    shares.map((g) => h('tr', h('td', g.gateway), h('td', {class: 'num'}, String(num(g.recordsClaimed))),
      h('td', {class: 'num'}, String(num(g.recordsDone))))), 'gateways') : []));

  // Models under test (responders): side by side, and each against the first as a forest plot.
  const responders = (res && res.responders) || [];
  const comparisons = (res && res.comparisons) || [];
  const sequential = (res && res.sequential) || null;
  const updates = D.comparisonUpdates || [];
  patch(e.responders, [responders, comparisons, sequential, updates.length],
    () => [...responderNodes(responders, comparisons), ...sequentialNodes(sequential, updates)]);
  const respondersPanel = e.responders.closest('section');
  if (respondersPanel) respondersPanel.hidden = !responders.length;

  syncResults(D);
  const checklists = new Map(D.checklists);
  for (const c of (res && res.checklists) || []) checklists.set(c.id, c);
  patch(e.checklists, [...checklists.values()], () => checklistNodes([...checklists.values()]));
}

/** The run's records: the snapshot's count or, fresher for an open run, the last page's. */
function recordsTotal(D) {
  const P = D.results;
  return Math.max(num(D.run.recordsTotal), P && P.res ? num(P.res.recordsTotal) : 0);
}

/** What the page shown depends on: when it changes, the page is read again. */
function wanted(D) {
  const {run} = D;
  return JSON.stringify([D.results.page, run.state, num(run.recordsDone), D.recordsScored, D.recordsFailed,
    num(run.recordsTotal), Boolean(run.open)]);
}

/**
 * Read the page asked for again when it is not on screen yet or the run moved on since it was
 * read (records scored, state, more records): at once the first time, else at most every
 * RESULTS_REFRESH_MS. Then show what is held.
 */
function syncResults(D) {
  const P = D.results;
  if (wanted(D) !== P.version && !P.loading && !P.timer) {
    const wait = P.shown < 0 ? 0 : Math.max(0, P.lastAt + RESULTS_REFRESH_MS - Date.now());
    P.timer = setTimeout(() => loadResults(D), wait);
  }
  renderResults(D);
}

/** Show page `page` (Previous / Next): read at once; an older answer still coming is dropped. */
function goPage(D, page) {
  const P = D.results;
  if (page < 0 || page >= P.tokens.length || page === P.page) return;
  P.page = page;
  clearTimeout(P.timer);
  P.timer = 0;
  P.loading = false;
  loadResults(D);
  renderResults(D);
}

async function loadResults(D) {
  const P = D.results;
  P.timer = 0;
  if (app.view !== D) return;
  const gen = ++P.gen;
  const page = P.page;
  const version = wanted(D);
  P.loading = true;
  P.lastAt = Date.now();
  try {
    const res = await api('ListRunResults', {runId: D.id, pageSize: P.size, pageToken: P.tokens[page]});
    if (app.view !== D || gen !== P.gen) return;
    P.res = res;
    P.shown = page;
    P.error = null;
    // the pages after this one follow from its token (none: this is the last one, for now)
    P.tokens.length = page + 1;
    if (res.nextPageToken) P.tokens.push(res.nextPageToken);
  } catch (err) {
    if (app.view !== D || gen !== P.gen || err.unauthorized) return;
    P.error = err;
  }
  P.loading = false;
  P.version = version; // also after an error: read again once the run moves, not in a loop
  P.lastAt = Date.now();
  if (D.run) renderChecklistEval(D);
}

function renderResults(D) {
  const P = D.results;
  const {run, els: e} = D;
  e.recordsOpen.hidden = !run.open;
  const rows = (P.res && P.res.results) || [];
  const total = recordsTotal(D);
  const first = P.shown * P.size + 1;
  const last = P.shown * P.size + rows.length;
  const range = P.shown < 0 ? 'Loading records…'
    : rows.length ? `records ${count(first)}–${count(last)} of ${count(total)}`
      : `no record results yet · ${plural(total, 'record')}`;
  e.recordsRange.textContent = range + (P.loading && P.page !== P.shown && P.shown >= 0 ? ' · loading…' : '');
  e.recordsRange.dataset.first = rows.length ? String(first) : '0';
  e.recordsRange.dataset.last = rows.length ? String(last) : '0';
  e.recordsRange.dataset.total = String(total);
  e.recordsRange.dataset.page = String(P.shown);
  patch(e.records, P.res ? [P.shown, rows] : null, () => recordsNodes(rows));
  e.recordsPrev.disabled = P.page <= 0;
  e.recordsNext.disabled = P.page !== P.shown || P.page + 1 >= P.tokens.length;
  patch(e.recordsError, P.error ? [P.error.code, P.error.message] : null, () => (P.error ? errorNodes(P.error) : []));
}

const count = (n) => num(n).toLocaleString();

/** The responders side by side (mean and interval, responses, failures, answering tokens), then
 * each one's comparison with the first (the baseline) as a forest plot and a table. */
function responderNodes(responders, comparisons) {
  if (!responders.length) return [];
  const rows = responders.map((r, i) => {
    const a = r.aggregate || {};
    const u = a.uncertainty;
    const usage = r.usage || {};
    return h('tr', {class: 'responder', 'data-responder': r.name},
      h('td', {class: 'text'}, r.name + (i === 0 ? ' (baseline)' : '')),
      h('td', {class: 'num mean'}, fmtScore(a.meanPrimaryScore)),
      h('td', {class: 'num'}, u ? `[${fmtScore(u.ciLow)}, ${fmtScore(u.ciHigh)}]` : '—'),
      h('td', {class: 'num'}, String(num(r.responses))),
      h('td', {class: 'num'}, String(num(r.failed))),
      h('td', {class: 'num missing', title: missingTitle(r.missing)}, String((r.missing || []).length)),
      h('td', {class: 'num'}, String(num(usage.promptTokens) + num(usage.completionTokens))));
  });
  return [
    table(['Responder', 'Mean primary', 'Interval', 'Responses', 'Failed', 'Records missing', 'Answering tokens'], rows, 'responders'),
    comparisons.length ? responderForest(comparisons) : null,
    comparisons.length ? table(['Candidate', 'Baseline', 'Difference', 'Interval', 'Method', 'p'],
      comparisons.map((c) => h('tr', {class: 'comparison', 'data-candidate': c.candidateRunId},
        h('td', {class: 'text'}, c.candidateRunId), h('td', {class: 'text'}, c.baselineRunId),
        h('td', {class: 'num diff'}, fmtDiff(c.diff)), h('td', {class: 'num'}, `[${fmtDiff(c.ciLow)}, ${fmtDiff(c.ciHigh)}]`),
        h('td', {class: 'text'}, String(c.method || '').replace('COMPARE_METHOD_', '').toLowerCase()),
        h('td', {class: 'num'}, c.pValue == null ? '—' : Number(c.pValue).toFixed(4)))), 'comparisons') : null,
  ];
}

/** A run that stops when decided: each candidate's interval as it narrowed over the records (one
 * row per `comparisonUpdated` event, then the run's final sequence), and what stopping saved. */
function sequentialNodes(sequential, updates) {
  const last = sequential ? [{recordsUsed: sequential.recordsUsed, comparisons: sequential.comparisons || [], final: true}] : [];
  const steps = [...updates, ...last];
  if (!steps.length) return [];
  const decision = (c) => enumLabel(c.decision, 'SEQUENTIAL_DECISION_');
  const rows = steps.flatMap((u) => (u.comparisons || []).map((c) => ({
    label: `${c.candidate}, ${num(u.recordsUsed)} records`,
    lo: Number(c.low), hi: Number(c.high), d: Number(c.meanDifference), cls: u.final ? 'ci final' : 'ci',
    data: {'data-candidate': c.candidate, 'data-records': String(num(u.recordsUsed)),
      'data-decision': decision(c), ...(u.final ? {'data-final': 'true'} : {})},
  })));
  const saved = sequential ? kv([
    ['Order seed', String(sequential.seed)],
    ['Records compared', String(num(sequential.recordsUsed))],
    ['Stopped early', sequential.stoppedEarly ? 'yes' : 'no'],
    ['Records not asked', String((sequential.recordsNotAsked || []).length)],
    ['Calls saved (about)', String(num(sequential.callsSaved))],
    ...(sequential.comparisons || []).map((c) => [`${c.candidate} vs ${c.baseline}`, decision(c)]),
  ]) : [];
  return [
    h('h3', 'Stopping when decided'),
    forest(rows, {
      id: 'sequential-forest',
      left: 200,
      ends: true,
      ariaLabel: 'the confidence sequence as it narrowed over the records',
      caption: 'Each candidate minus the baseline as its anytime-valid interval narrowed, record count by record count; the last row is where the run stands.',
    }),
    h('dl', {class: 'kv', id: 'sequential'}, saved),
  ];
}

/** The records a responder has no scored response for, as a tooltip (the first twenty). */
function missingTitle(missing) {
  const ids = missing || [];
  if (!ids.length) return null;
  return ids.slice(0, 20).join(', ') + (ids.length > 20 ? ` and ${ids.length - 20} more` : '');
}

/** Each responder's difference from the baseline with its interval: one row each, a zero line. */
function responderForest(comparisons) {
  const rows = comparisons.map((c) => ({
    label: c.candidateRunId, lo: Number(c.ciLow), hi: Number(c.ciHigh), d: Number(c.diff), cls: 'ci',
    data: {'data-candidate': c.candidateRunId},
  }));
  return forest(rows, {
    id: 'responder-forest',
    left: 140,
    ariaLabel: 'each responder against the baseline',
    caption: 'Each responder minus the baseline, with its interval; the dashed line is no difference.',
  });
}

function recordsNodes(rows) {
  if (!rows.length) return [];
  const byResponder = rows.some((r) => r.responder);
  const head = byResponder ? ['Index', 'Record', 'Responder', 'Primary score', 'Pass rate', 'Checklist']
    : ['Index', 'Record', 'Primary score', 'Pass rate', 'Checklist'];
  return table(head, rows.map((r) => {
    const sc = r.score;
    return h('tr', {class: ['record', !sc && 'failed'], 'data-key': `record/${num(r.index)}`,
      'data-index': String(num(r.index)), 'data-record-id': r.recordId || ''},
    h('td', {class: 'num'}, String(num(r.index))),
    h('td', {class: 'text record-id'}, r.recordId || '—'),
    byResponder ? h('td', {class: 'text responder', title: r.response || ''}, r.responder || '—') : null,
    sc ? h('td', {class: 'num score'}, fmtScore(sc.primaryScore))
      : h('td', {class: 'text error-text'}, r.error || 'no score'),
    h('td', {class: 'num'}, sc ? fmtPct(sc.passRate) : '—'),
    h('td', {class: 'checklist-id'}, r.checklistId || '—'));
  }), 'records');
}

function checklistNodes(checklists) {
  if (!checklists.length) return h('p', {class: 'muted'}, 'No checklist yet.');
  return checklists.map((c) => {
    const items = c.items || [];
    return h('details', {class: 'checklist', 'data-key': `checklist/${c.id}`, 'data-checklist-id': c.id || ''},
      h('summary', `${c.id || 'checklist'} · ${plural(items.length, 'item')}${c.sourceMethod ? ` · ${c.sourceMethod}` : ''}`),
      c.input ? h('p', h('span', {class: 'muted'}, 'For: '), h('span', {class: 'text'}, c.input)) : null,
      h('ol', {class: 'items'}, items.map((it) => h('li', {'data-item-id': it.id || ''},
        h('span', {class: 'text'}, it.question),
        it.category ? [' ', tag(it.category)] : null,
        it.weight != null ? [' ', tag(`weight ${it.weight}`)] : null))));
  });
}

export function buildGenerate(D) {
  D.els.checklists = h('div', {id: 'checklists'});
  return [buildProgress(D, 'Records'), panel('Checklist', D.els.checklists)];
}

export function renderGenerate(D) {
  const {run, els: e} = D;
  const checklists = new Map(D.checklists);
  const result = run.result && run.result.checklist;
  if (result) checklists.set(result.id, result);
  const total = num(run.recordsTotal);
  renderProgress(D, result ? Math.max(total, num(run.recordsDone)) : num(run.recordsDone), total, 0);
  patch(e.checklists, [...checklists.values()], () => checklistNodes([...checklists.values()]));
}
