/*
 * Assay admin page, run detail: a self-refine run (its passes and their similarity figures, the
 * final text), and the self-refine hook's record that refinement and debate results carry.
 */

import {enumLabel, fmtScore, num, plural, tokensOf, yesNo} from '../format.js';
import {h, kv, panel, patch, tag} from '../render.js';
import {buildProgress, renderProgress} from './progress.js';

export function buildSelfRefine(D) {
  const e = D.els;
  e.srSummary = h('dl', {id: 'self-refine-summary', class: 'kv'});
  e.passes = h('ol', {id: 'passes', class: 'passes'});
  e.passesNone = h('p', {class: 'muted'}, 'No pass finished yet.');
  e.finalText = h('pre', {id: 'final-text', class: 'text'});
  e.finalNote = h('p', {class: 'muted small'});
  return [
    buildProgress(D, 'Passes'),
    panel('Summary', e.srSummary),
    panel('Passes', e.passesNone, e.passes),
    panel('Final text', e.finalNote, e.finalText),
  ];
}

export function renderSelfRefine(D) {
  const {run, els: e} = D;
  const res = run.result && run.result.selfRefine;
  const passes = res ? res.passes || [] : [...D.passes.values()].sort((a, b) => num(a.pass) - num(b.pass));
  renderProgress(D, Math.max(num(run.recordsDone), passes.length), num(run.recordsTotal),
    passes.filter((x) => x.error).length);
  patch(e.srSummary, [res || null, passes.length], () => (res ? kv([
    ['Stop reason', enumLabel(res.stopReason, 'SELF_REFINE_STOP_REASON_')],
    ['Passes', String(passes.length)],
    ['Converged', yesNo(res.converged)],
    ['Rolled back', yesNo(res.rolledBack)],
    ['Changed', yesNo(res.changed)],
    ['Skipped (too short)', res.skippedTooShort ? 'yes' : null],
    ['Degraded from', res.degradedFrom || null],
    ['Model', res.model ? `${res.model.backend || ''} ${res.model.model || ''}`.trim() : null],
    ['Tokens', String(tokensOf(res.usage))],
  ]) : kv([['Passes so far', String(passes.length)], ['Tokens', String(tokensOf(run.usage))]])));
  e.passesNone.hidden = passes.length > 0;
  patch(e.passes, passes, () => passes.map((x) => passNode(x, 'pass')));
  e.finalText.textContent = res ? res.finalText || '' : '';
  e.finalNote.textContent = res ? '' : 'The final text appears when the run finishes; each pass\'s revision is under Passes.';
}

function passNode(pass, keyPrefix) {
  const n = num(pass.pass);
  const flags = [
    pass.converged ? tag('converged', 'good') : null,
    pass.rolledBack ? tag('rolled back', 'warn') : null,
    pass.diverged ? tag('diverged') : null,
    pass.revisedBlockMissing ? tag('no <revised> block', 'warn') : null,
    pass.error ? tag('failed', 'bad') : null,
  ];
  const critique = pass.critique || [];
  return h('li', {
    class: ['pass', pass.converged && 'converged', pass.rolledBack && 'rolled-back', pass.error && 'failed'], 'data-pass': String(n),
  },
  h('header', h('h4', `Pass ${n}`), h('span', {class: 'tags'}, flags)),
  h('dl', {class: 'kv'}, kv([
    ['Char similarity', h('span', {class: 'char-similarity'}, fmtScore(pass.charSimilarity))],
    ['Jaccard', h('span', {class: 'jaccard'}, pass.jaccard != null
      ? `${fmtScore(pass.jaccard)}${pass.jaccardConfidence != null ? ` (confidence ${fmtScore(pass.jaccardConfidence)})` : ''}` : '—')],
    ['Cosine', h('span', {class: 'cosine'}, pass.cosine != null ? fmtScore(pass.cosine) : '—')],
    ['Decided by', h('span', {class: 'decided-by'}, pass.decidedBy || '—')],
    ['Converged', yesNo(pass.converged)],
    ['Rolled back', yesNo(pass.rolledBack)],
    ['Similarity to original', pass.similarityToOriginal != null
      ? `${fmtScore(pass.similarityToOriginal)}${pass.similarityMeasure ? ` (${pass.similarityMeasure})` : ''}` : null],
    ['Rollback threshold', pass.rollbackThreshold != null ? fmtScore(pass.rollbackThreshold) : null],
    ['Degraded from', pass.degradedFrom ? `${pass.degradedFrom}${pass.degradedReason ? `: ${pass.degradedReason}` : ''}` : null],
    ['Tokens', pass.usage ? String(tokensOf(pass.usage)) : null],
    ['Error', pass.error ? h('span', {class: 'error-text'}, pass.error) : null],
  ])),
  critique.length ? [h('h5', 'Critique'), h('ul', {class: 'critique texts'}, critique.map((c) => h('li', {class: 'text'}, c)))] : null,
  pass.revised ? h('details', {'data-key': `${keyPrefix}/${n}/revised`},
    h('summary', 'Revised text'), h('pre', {class: 'text'}, pass.revised)) : null);
}

/** One output through the self-refine hook (refinement sections, debate answers). */
export function selfRefinedNode(x, key) {
  const passes = (x.refine && x.refine.passes) || [];
  const changed = !x.skipped && !x.error && x.after !== x.before;
  const status = x.skipped ? `skipped: ${x.skipped}` : x.error ? `failed: ${x.error}` : changed ? 'refined' : 'unchanged';
  return h('div', {class: 'self-refined', 'data-target': x.target || ''},
    h('p', h('code', x.target || '—'), ` · written by ${x.producer || '—'} · ${status}`,
      x.refine ? ` · stop: ${enumLabel(x.refine.stopReason, 'SELF_REFINE_STOP_REASON_')}` : ''),
    passes.length ? h('details', {'data-key': `${key}/passes`}, h('summary', plural(passes.length, 'pass')),
      h('ol', {class: 'passes'}, passes.map((p) => passNode(p, `${key}/pass`)))) : null,
    changed ? h('details', {'data-key': `${key}/before`}, h('summary', 'Text before the hook'), h('pre', {class: 'text'}, x.before || '')) : null);
}
