/*
 * Assay admin page: two checklist evaluations compared ("#/compare/<baseline>/<candidate>",
 * CompareRuns): both means, the difference with its interval as a forest plot (SVG), method and
 * p-value, the flipped items and the worst records.
 */

import {confLevel, fmtScore, num, plural} from './format.js';
import {api, errorNodes} from './api.js';
import {els} from './page.js';
import {forest, fmtDiff} from './forest.js';
import {h, kv, panel, table} from './render.js';

/** The compare view: `gen` counts openings, so an answer for a view since left is dropped. */
export const compare = {gen: 0};
const COMPARE_METRICS = [
  ['COMPARE_METRIC_PRIMARY', 'primary score'], ['COMPARE_METRIC_PASS_RATE', 'pass rate'],
  ['COMPARE_METRIC_WEIGHTED', 'weighted score'], ['COMPARE_METRIC_NORMALIZED', 'normalized score'],
];
const fmtP = (v) => (v == null || !Number.isFinite(Number(v)) ? '—' : Number(v) < 0.0001 ? '< 0.0001' : Number(v).toFixed(4));

/** "COMPARE_METHOD_PAIRED_T" -> "paired_t" (evalconfidence's names). */
const methodName = (m) => String(m || '').replace(/^COMPARE_METHOD_/, '').toLowerCase() || '—';

/** The compare view's location for two run ids. */
export function compareHash(baseline, candidate) {
  return `#/compare/${encodeURIComponent(baseline)}/${encodeURIComponent(candidate)}`;
}

/** Open the compare view of two runs (CompareRuns on `metric`). */
export async function openCompare(baseline, candidate, metric = 'COMPARE_METRIC_PRIMARY') {
  const gen = ++compare.gen;
  els.listView.hidden = true;
  els.detailView.hidden = true;
  els.detailView.replaceChildren();
  els.compareView.hidden = false;
  window.scrollTo(0, 0);
  document.title = 'Compare runs · Assay admin';
  const runLink = (id) => h('a', {href: `#/runs/${encodeURIComponent(id)}`}, h('code', id));
  const metricSelect = h('select', {id: 'compare-metric'},
    COMPARE_METRICS.map(([value, label]) => h('option', {value, selected: value === metric}, label)));
  metricSelect.addEventListener('change', () => openCompare(baseline, candidate, metricSelect.value));
  const head = [
    h('a', {id: 'back', class: 'back', href: '#/'}, '← All runs'),
    h('header', {class: 'run-head'},
      h('h2', {id: 'compare-title', tabindex: '-1'}, 'Compare runs'),
      h('p', {class: 'run-sub'}, 'Candidate ', runLink(candidate), ' minus baseline ', runLink(baseline), ' · ',
        h('label', 'Metric ', metricSelect))),
  ];
  els.compareView.replaceChildren(h('section', {id: 'compare', 'aria-labelledby': 'compare-title'}, head,
    h('p', {class: 'muted'}, 'Comparing…')));
  let res;
  try {
    res = await api('CompareRuns', {baselineRunId: baseline, candidateRunId: candidate, metric});
  } catch (err) {
    if (gen !== compare.gen || err.unauthorized) return;
    els.compareView.replaceChildren(h('section', {id: 'compare', 'data-error': err.code || 'ERROR'}, head,
      h('div', {id: 'compare-error', class: 'error', role: 'alert'}, errorNodes(err))));
    return;
  }
  if (gen !== compare.gen) return;
  els.compareView.replaceChildren(h('section', {
    id: 'compare', 'aria-labelledby': 'compare-title', 'data-baseline': baseline, 'data-candidate': candidate,
    'data-method': methodName(res.method),
  }, head, compareNodes(res, baseline, candidate, runLink)));
  document.getElementById('compare-title').focus();
}

function compareNodes(r, baseline, candidate, runLink) {
  const conf = confLevel(r.alpha);
  const side = (name, id, mean, n, cls) => h('div', {class: ['compare-side', cls]},
    h('h4', name), h('p', runLink(id)), h('p', {class: 'mean', id: `mean-${cls}`}, fmtScore(mean)),
    h('p', {class: 'muted'}, `mean over ${plural(num(n), 'record')}`));
  const worse = r.significant && Number(r.diff) < 0;
  const better = r.significant && Number(r.diff) > 0;
  const verdict = worse ? 'significantly worse' : better ? 'significantly better' : 'no significant difference';
  const flipped = (r.items || []).filter((i) => num(i.yesToNo) + num(i.noToYes) > 0);
  const unmatched = [...(r.baselineOnly || []).map((id) => [id, 'baseline only']),
    ...(r.candidateOnly || []).map((id) => [id, 'candidate only']),
    ...(r.unscoredBaseline || []).map((id) => [id, 'unscored in baseline']),
    ...(r.unscoredCandidate || []).map((id) => [id, 'unscored in candidate'])];
  return [
    h('div', {class: 'compare-sides'},
      side('Baseline', baseline, r.meanBaseline, r.nBaseline, 'baseline'),
      side('Candidate', candidate, r.meanCandidate, r.nCandidate, 'candidate')),
    panel('Difference (candidate − baseline)',
      h('p', h('strong', {id: 'compare-diff'}, fmtDiff(r.diff)), ` ${conf} CI `,
        h('span', {id: 'compare-ci'}, `[${fmtDiff(r.ciLow)}, ${fmtDiff(r.ciHigh)}]`), ' · ',
        h('span', {class: ['verdict', worse && 'worse', better && 'better'], id: 'compare-verdict'}, verdict)),
      differenceForest(r),
      h('dl', {class: 'kv', id: 'compare-stats'}, kv([
        ['Method', h('code', {id: 'compare-method'}, methodName(r.method))],
        ['Paired', r.paired ? `yes, ${plural(num(r.nPairs), 'record')}` : 'no (unpaired fallback)'],
        ['p-value', h('span', {id: 'compare-p'}, fmtP(r.pValue))],
        ['Variance reduction from pairing', r.varianceReduction != null ? `${Number(r.varianceReduction).toFixed(2)}×` : null],
        ['Effective records', r.effectiveN != null ? Number(r.effectiveN).toFixed(0) : null],
        ['Bootstrap interval', r.bootstrap
          ? `[${fmtDiff(r.bootstrap.ciLow)}, ${fmtDiff(r.bootstrap.ciHigh)}] (${num(r.bootstrap.resamples)} resamples, seed ${r.bootstrap.seed})` : null],
        ['Discordant records', r.nDiscordant != null ? String(num(r.nDiscordant)) : null],
      ])),
      (r.warnings || []).map((w) => h('p', {class: 'warn-text'}, 'Warning: ', w)),
      (r.notes || []).map((n) => h('p', {class: 'muted'}, n))),
    panel('Items that flipped', h('div', {id: 'flips'}, flipped.length
      ? table(['Item', 'yes → no', 'no → yes', 'Records compared'], flipped.map((i) => h('tr', {class: 'flip'},
        h('td', {class: 'text'}, i.item), h('td', {class: 'num'}, String(num(i.yesToNo))),
        h('td', {class: 'num'}, String(num(i.noToYes))), h('td', {class: 'num'}, String(num(i.compared))))), 'flips')
      : h('p', {class: 'muted'}, 'No item flipped.'))),
    panel('Largest regressions', h('div', {id: 'worst'}, (r.worstRegressions || []).length
      ? table(['Record', 'Baseline', 'Candidate', 'Difference'], r.worstRegressions.map((w) => h('tr',
        {class: 'worst', 'data-record-id': w.recordId},
        h('td', {class: 'text'}, w.recordId), h('td', {class: 'num'}, fmtScore(w.baseline)),
        h('td', {class: 'num'}, fmtScore(w.candidate)), h('td', {class: 'num'}, fmtDiff(w.diff)))), 'worst')
      : h('p', {class: 'muted'}, 'No record got worse.'))),
    unmatched.length ? panel('Records not compared', table(['Record', 'Why'],
      unmatched.map(([id, why]) => h('tr', h('td', {class: 'text'}, id), h('td', why))), 'unmatched')) : null,
  ];
}

/** The difference and its intervals as a forest plot: a zero line, each interval, the point. */
function differenceForest(r) {
  const d = Number(r.diff);
  const rows = [{label: methodName(r.method), lo: Number(r.ciLow), hi: Number(r.ciHigh), d, cls: 'ci'}];
  if (r.bootstrap) rows.push({label: 'bootstrap', lo: Number(r.bootstrap.ciLow), hi: Number(r.bootstrap.ciHigh), d, cls: 'bootstrap'});
  return forest(rows, {
    id: 'forest',
    ends: true,
    ariaLabel: `difference ${fmtDiff(d)}, interval ${fmtDiff(r.ciLow)} to ${fmtDiff(r.ciHigh)}`,
    caption: `${confLevel(r.alpha)} intervals on the difference; the dashed line is no difference.`,
  });
}
