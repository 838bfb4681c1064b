/*
 * Assay admin page, run detail: the audit log (control actions) and the log of recent events, each
 * event summarised in one line.
 */

import {EVENT_LOG_CAP} from '../constants.js';
import {clip, enumLabel, fmtScore, kindLabel, num, plural, stateLabel} from '../format.js';
import {h, patch, tag, timeEl} from '../render.js';
import {classify} from './model.js';

export function renderAudit(D) {
  const {run, els: e} = D;
  const tr = run.result && run.result.targetedRefinement;
  // Every source that may carry it; the longest is the most complete.
  const sources = [run.auditLog, tr && tr.auditLog, run.refinement && run.refinement.auditLog].filter(Array.isArray);
  const entries = sources.reduce((best, l) => (l.length > best.length ? l : best), []);
  patch(e.audit, entries, () => entries.map((a) => h('li', {class: 'audit-entry'},
    timeEl(a.time), ' ', h('span', {class: 'actor'}, a.actor || '—'), ' ', h('span', {class: 'action'}, a.action || '—'),
    a.detail ? [' — ', h('span', {class: 'detail'}, a.detail)] : null)));
  e.auditNone.hidden = entries.length > 0;
}

export function flushEventLog(D) {
  const e = D.els;
  if (!D.pendingLog.length) return;
  const items = D.pendingLog.splice(0).slice(-EVENT_LOG_CAP);
  const frag = document.createDocumentFragment();
  for (let i = items.length - 1; i >= 0; i -= 1) frag.append(eventNode(items[i]));
  e.events.prepend(frag);
  while (e.events.childElementCount > EVENT_LOG_CAP) e.events.lastElementChild.remove();
  e.eventsMeta.textContent = `${plural(D.eventCount, 'event')}, newest first`
    + (D.eventCount > EVENT_LOG_CAP ? ` (the last ${EVENT_LOG_CAP} shown)` : '');
}

function eventNode(ev) {
  const k = classify(ev);
  const vr = k.inner === 'verificationResult' ? ev.refinement.verificationResult : null;
  return h('li', {
    class: ['event', vr && vr.humanEdit && 'human-edit', vr && (vr.accepted ? 'accepted' : 'rejected')],
    'data-kind': k.kind, 'data-seq': String(num(ev.sequence)),
  },
  h('span', {class: 'seq'}, `#${num(ev.sequence)}`), ' ', timeEl(ev.time, true), ' ',
  h('span', {class: 'kind'}, k.kind),
  vr && vr.humanEdit ? [' ', tag('human edit', 'human')] : null,
  vr ? [' ', tag(vr.accepted ? 'accepted' : 'rejected', vr.accepted ? 'good' : 'bad')] : null,
  ' ', h('span', {class: 'summary'}, summarize(ev, k)));
}

function summarize(ev, k) {
  const x = ev[k.member] || {};
  switch (k.member) {
    case 'started': return `${kindLabel(x.kind)} run started (${plural(num(x.records), 'unit')} of work)`;
    case 'progress': {
      const p = x.progress || {};
      return `${x.service || 'stage'}: ${p.stage || ''}${p.message ? ` — ${p.message}` : ''}${num(p.total) ? ` (${num(p.done)}/${num(p.total)})` : ''}`;
    }
    case 'checklistReady':
      return `checklist ${(x.checklist && x.checklist.id) || ''} ready: ${plural(((x.checklist && x.checklist.items) || []).length, 'item')} for ${plural((x.recordIndices || []).length, 'record')}`;
    case 'recordScored':
      return x.score
        ? `record ${x.recordId || num(x.index)} scored ${fmtScore(x.score.primaryScore)}`
        : `record ${x.recordId || num(x.index)} failed: ${x.error || 'no score'}`;
    case 'aggregate':
      return `aggregate: mean primary score ${fmtScore(x.aggregate && x.aggregate.meanPrimaryScore)} over ${num(x.aggregate && x.aggregate.targets)} targets`;
    case 'refinement': return `iteration ${num(x.iteration)}: ${refinementSummary(k.inner, x[k.inner] || {})}`;
    case 'selfRefinePass':
      return `pass ${num(x.pass)}: char ${fmtScore(x.charSimilarity)}${x.decidedBy ? `, decided by ${x.decidedBy}` : ''}${x.converged ? ', converged' : ''}${x.rolledBack ? ', rolled back' : ''}${x.error ? `, failed: ${x.error}` : ''}`;
    case 'debateStage': {
      const st = x.stage || {};
      return `problem ${x.problemId}: ${st.stage || 'stage'}${st.round ? ` round ${st.round}` : ''} done${st.consensus ? ' (consensus)' : ''}`;
    }
    case 'stateChanged': return `state → ${stateLabel(x.state)}${x.reason ? `: ${x.reason}` : ''}`;
    case 'completed': return `run finished: ${stateLabel(x.state)}${x.result && x.result.error ? ` — ${x.result.error}` : ''}`;
    case 'debateProblemDone':
      return `problem ${x.id} done: ${x.error ? `failed: ${x.error}` : `answer “${clip(x.finalAnswer)}”`}${x.correct == null ? '' : x.correct ? ', correct' : ', incorrect'}`;
    case 'selfRefined':
      return `self-refine hook on ${x.target} (${x.producer || '—'}): ${x.skipped ? `skipped, ${x.skipped}` : x.error ? `failed: ${x.error}` : x.after !== x.before ? 'refined' : 'unchanged'}`;
    case 'recordsClaimed':
      return `records ${num(x.first)}–${num(x.first) + num(x.count) - 1} claimed by gateway ${x.gateway}${x.takeover ? ' (taken over from an expired claim)' : ''}`;
    case 'comparisonUpdated':
      return `comparison after ${num(x.recordsUsed)} records: ${(x.comparisons || []).map((c) =>
        `${c.candidate} vs ${c.baseline}: ${fmtScore(c.meanDifference)} [${fmtScore(c.low)}, ${fmtScore(c.high)}] ${enumLabel(c.decision, 'SEQUENTIAL_DECISION_')}`).join('; ')}`;
    default: return 'unknown event';
  }
}

function refinementSummary(inner, x) {
  switch (inner) {
    case 'refinementStart':
    case 'iterationStarted': {
      const plan = x.plan || {};
      const tasks = (plan.batches || []).reduce((n, b) => n + (b.tasks || []).length, 0);
      const level = plan.consolidation ? enumLabel(plan.consolidation.agreement, 'AGREEMENT_LEVEL_') : '—';
      return `plan of ${plural(tasks, 'task')} in ${plural((plan.batches || []).length, 'batch', 'batches')}, ~${num(plan.estimatedTokens)} tokens, ${level} agreement${x.fullRegenerate ? ', full regeneration' : ''}`;
    }
    case 'batchStarted': return `batch ${num(x.batchIndex) + 1}/${num(x.batchesTotal)} started (${plural((x.taskIds || []).length, 'task')})`;
    case 'taskStarted': return `task ${(x.task && x.task.id) || ''} started: ${enumLabel(x.task && x.task.action, 'FIX_ACTION_')} of ${(x.task && x.task.sectionId) || ''}`;
    case 'patchRejected': return `${enumLabel(x.action, 'FIX_ACTION_')} of ${x.sectionId} not kept${x.reason ? `: ${x.reason}` : ''}`;
    case 'patchApplied': return `${enumLabel(x.action, 'FIX_ACTION_')} of ${x.sectionId}${x.diffSummary ? `: ${x.diffSummary}` : ''}`;
    case 'verificationResult':
      return `${x.humanEdit ? 'human edit of ' : ''}${x.sectionId}: ${x.accepted ? 'accepted' : 'rejected'}${x.rolledBack ? ', rolled back' : ''}${x.reason ? ` — ${x.reason}` : ''} (${plural(num(x.editCount), 'edit')})`;
    case 'batchComplete': return `batch ${num(x.batchIndex) + 1} complete: ${num(x.tasksCompleted)} completed, ${num(x.tasksFailed)} failed, ${num(x.tasksSkipped)} skipped`;
    case 'sectionLocked': return `section ${x.sectionId} locked after ${plural(num(x.editCount), 'edit')}`;
    case 'iterationComplete':
      return `iteration complete: score ${fmtScore(x.score)}, ${num(x.tokensUsed)} tokens used, ${num(x.tasksCompleted)} tasks completed, ${num(x.tasksFailed)} failed${(x.restoredSectionIds || []).length ? `, restored ${x.restoredSectionIds.join(', ')}` : ''}`;
    case 'convergenceDetected': return `stopping: ${x.reason || 'converged'}`;
    case 'bestEffortSelected': {
      const be = x.bestEffort || {};
      return `best effort: score ${fmtScore(be.bestScore)} at iteration ${num(be.bestIteration)}, ${plural(num(be.unresolvedIssuesCount), 'unresolved issue')}`;
    }
    case 'escalationTriggered': return `escalated to a human: ${x.reason || ''} (best ${fmtScore(x.bestScore)} at iteration ${num(x.bestIteration)})`;
    case 'refinementComplete': return `refinement complete: ${enumLabel(x.outcome, 'REFINEMENT_OUTCOME_')}, final score ${fmtScore(x.finalScore)}, ${plural(num(x.iterations), 'iteration')}`;
    case 'judged': {
      const failedJudges = (x.judges || []).filter((j) => !j.verdict).length;
      return `judged: score ${fmtScore(x.score)}, ${plural(num(x.openIssues), 'open issue')} (${num(x.criticalIssues)} critical)${failedJudges ? `, ${failedJudges} judge(s) failed` : ''}`;
    }
    case 'consistencyChecked': return `check of ${x.sectionId} after ${x.previousSectionId}: ${x.consistent ? 'consistent, no edit' : 'inconsistent, patching'}${x.reason ? ` — ${x.reason}` : ''}`;
    default: return 'refinement event';
  }
}
