/*
 * Assay admin page, run detail: a checklist evaluation (aggregates, category pass rates, each
 * record's score, the checklists) and a checklist generation (the checklist).
 */

import {RECORD_ROWS_CAP} from '../constants.js';
import {confLevel, fmtPct, fmtScore, num, plural, tokensOf} from '../format.js';
import {h, kv, panel, patch, table, tag} from '../render.js';
import {buildProgress, renderProgress} from './progress.js';

export function buildChecklistEval(D) {
  const e = D.els;
  e.aggregates = h('dl', {id: 'aggregates', class: 'kv'});
  e.categories = h('div', {id: 'category-rates'});
  e.records = h('div', {id: 'records'});
  e.checklists = h('div', {id: 'checklists'});
  return [
    buildProgress(D, 'Records'),
    panel('Aggregates', e.aggregates, e.categories),
    panel('Records', e.records),
    panel('Checklists', e.checklists),
  ];
}

export function renderChecklistEval(D) {
  const {run, els: e} = D;
  const res = run.result && run.result.checklistEval;
  const records = res && (res.results || []).length
    ? res.results : [...D.records.values()].sort((a, b) => num(a.index) - num(b.index));
  const failed = records.filter((r) => r.error || !r.score).length;
  const done = Math.max(num(run.recordsDone), D.records.size, records.length);
  renderProgress(D, done, num(run.recordsTotal), failed);

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

  patch(e.records, records, () => recordsNodes(records));
  const checklists = new Map(D.checklists);
  for (const c of (res && res.checklists) || []) checklists.set(c.id, c);
  patch(e.checklists, [...checklists.values()], () => checklistNodes([...checklists.values()]));
}

function recordsNodes(records) {
  if (!records.length) return h('p', {class: 'muted'}, 'No record scored yet.');
  const shown = records.slice(0, RECORD_ROWS_CAP);
  return [
    records.length > shown.length ? h('p', {class: 'muted'}, `The first ${shown.length} of ${records.length} records.`) : null,
    table(['#', 'Record', 'Checklist', 'Primary score', 'Pass rate', 'Answered', 'Unanswered', 'Error'], shown.map((r) => {
      const sc = r.score;
      return h('tr', {class: ['record', !sc && 'failed'], 'data-record-id': r.recordId || ''},
        h('td', {class: 'num'}, String(num(r.index))), h('td', r.recordId), h('td', r.checklistId || '—'),
        h('td', {class: 'num'}, sc ? fmtScore(sc.primaryScore) : '—'), h('td', {class: 'num'}, sc ? fmtPct(sc.passRate) : '—'),
        h('td', {class: 'num'}, sc ? String(num(sc.answeredCount)) : '—'),
        h('td', {class: 'num'}, sc ? String(num(sc.unansweredCount)) : '—'),
        h('td', {class: 'text error-text'}, r.error || ''));
    }), 'records'),
  ];
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
