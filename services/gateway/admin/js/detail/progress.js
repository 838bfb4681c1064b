/*
 * Assay admin page, run detail: the progress panel of the pipelines that work through units
 * (records, problems, passes), with the stage's latest progress while the run goes on.
 */

import {TERMINAL} from '../constants.js';
import {num} from '../format.js';
import {h, panel} from '../render.js';

export function buildProgress(D, unit) {
  const e = D.els;
  e.recordsProgress = h('strong', {id: 'records-progress'}, '0/0');
  e.recordsBar = h('progress', {id: 'records-bar', max: '1', value: '0', 'aria-label': `${unit} done`});
  e.recordsFailed = h('strong', {id: 'records-failed'}, '0');
  e.stageProgress = h('p', {class: 'muted small'});
  return panel('Progress',
    h('p', `${unit} done `, e.recordsProgress, ' · failed ', e.recordsFailed), e.recordsBar, e.stageProgress);
}

export function renderProgress(D, done, total, failed) {
  const e = D.els;
  const shown = total > 0 ? Math.min(done, total) : done;
  e.recordsProgress.textContent = `${shown}/${total}`;
  e.recordsBar.max = Math.max(total, shown, 1);
  e.recordsBar.value = shown;
  e.recordsFailed.textContent = String(failed);
  const sp = D.stageProgress;
  const p = sp && sp.progress;
  e.stageProgress.textContent = p && !TERMINAL.has(D.run.state)
    ? `${sp.service || 'stage'} · ${p.stage || ''}${p.message ? `: ${p.message}` : ''}${num(p.total) ? ` (${num(p.done)}/${num(p.total)})` : ''}`
    : '';
}
