/*
 * Assay admin page, run detail: a targeted refinement (iteration and score history, the plan by
 * batch, unresolved issues, the document with changed and locked sections, the best-effort banner).
 */

import {enumLabel, firstNonEmpty, fmtScore, num, plural, tokensOf, yesNo} from '../format.js';
import {h, kv, panel, patch, s, table, tag} from '../render.js';
import {selfRefinedNode} from './self_refine.js';

/** The refinement as it stands: progress while running, the result once there is one. */
export function refinementView(D) {
  const run = D.run;
  const p = run.refinement || {};
  const r = (run.result && run.result.targetedRefinement) || null;
  const rr = r || {};
  let bestEffort = null;
  if (r && (r.bestEffort || r.outcome === 'REFINEMENT_OUTCOME_BEST_EFFORT')) {
    const be = r.bestEffort || {};
    bestEffort = {
      quality: be.quality || r.quality,
      bestScore: be.bestScore != null ? be.bestScore : r.finalScore,
      bestIteration: be.bestIteration != null ? be.bestIteration : r.bestIteration,
      unresolvedIssuesCount: be.unresolvedIssuesCount,
      unresolvedCategories: be.unresolvedCategories || [],
      improvementHints: firstNonEmpty(be.improvementHints, r.improvementHints),
    };
  } else if (!r && D.bestEffort) {
    bestEffort = D.bestEffort;
  }
  return {
    p, r,
    scores: (firstNonEmpty(rr.scoreHistory, p.scoreHistory)).map(Number),
    sections: firstNonEmpty(rr.sections, p.sections),
    changed: new Set(r ? rr.changedSectionIds || [] : p.changedSectionIds || []),
    locked: r ? firstNonEmpty(rr.lockedSectionIds, p.lockedSectionIds) : p.lockedSectionIds || [],
    tasks: p.tasks || [],
    issues: r ? rr.unresolvedIssues || [] : p.unresolvedIssues || [],
    tokensUsed: run.refinement ? num(p.tokensUsed) : tokensOf(rr.usage || run.usage),
    tokenLimit: num(p.tokenLimit),
    bestEffort,
  };
}

export function buildRefinement(D) {
  const e = D.els;
  e.banner = h('div', {class: 'banner-slot'});
  e.refSummary = h('dl', {id: 'refinement-summary', class: 'kv'});
  e.sparkline = s('svg', {id: 'sparkline', class: 'sparkline', viewBox: '0 0 240 64', role: 'img', 'aria-label': 'Score history'});
  e.sparkCaption = h('p', {class: 'muted small'});
  e.agreement = h('p', {id: 'agreement'});
  e.tokens = h('div', {id: 'tokens'});
  e.conflicts = h('ul', {id: 'conflicts', class: 'plain'});
  e.conflictsNone = h('p', {class: 'muted'}, 'No conflicts between criteria.');
  e.plan = h('div', {id: 'plan'});
  e.locked = h('ul', {id: 'locked', class: 'chips'});
  e.lockedNone = h('p', {class: 'muted'}, 'No section is locked.');
  e.issues = h('div', {id: 'issues'});
  e.document = h('div', {id: 'document'});
  e.hooks = h('div', {id: 'self-refined'});
  e.hooksPanel = panel('Self-refine hook', e.hooks);
  e.hooksPanel.hidden = true;
  return [
    e.banner,
    h('div', {class: 'cols'},
      panel('Iteration', e.refSummary, h('figure', {class: 'spark'}, e.sparkline, h('figcaption', e.sparkCaption)),
        h('h4', 'Locked sections'), e.locked, e.lockedNone),
      panel('Plan', e.agreement, e.tokens, h('h4', 'Conflict resolutions'), e.conflicts, e.conflictsNone)),
    panel('Tasks by batch', e.plan),
    panel('Unresolved issues', e.issues),
    panel('Document', h('p', {class: 'muted small'}, 'Sections changed from the document as given are marked.'), e.document),
    e.hooksPanel,
  ];
}

export function renderRefinement(D) {
  const e = D.els;
  const v = refinementView(D);
  const {p, r} = v;
  const rr = r || {};
  const plan = D.plan && D.plan.plan;
  const last = v.scores.length ? v.scores[v.scores.length - 1] : null;

  patch(e.banner, v.bestEffort, () => (v.bestEffort ? bestEffortBanner(v.bestEffort) : []));

  const summaryKey = [p.iteration, p.maxIterations, p.phase, p.mode, p.quality, p.tasksCompleted, p.tasksFailed,
    p.tasksTotal, p.converged, rr.iterations, rr.quality, rr.tasksCompleted, rr.tasksFailed, rr.stopReason, last,
    D.escalation && D.escalation.reason, D.plan && [D.plan.mode, D.plan.fullRegenerate, D.plan.fullRegenerateReason],
    D.convergence && D.convergence.reason];
  patch(e.refSummary, summaryKey, () => kv([
    ['Iteration', r ? `${num(rr.iterations)} run` : `${num(p.iteration)} of ${num(p.maxIterations)}`],
    ['Phase', p.phase || null],
    ['Mode', enumLabel(p.mode || (D.plan && D.plan.mode), 'REFINEMENT_MODE_')],
    ['Latest score', fmtScore(last)],
    ['Quality', enumLabel(rr.quality || p.quality, 'QUALITY_STATUS_')],
    ['Tasks', r
      ? `${num(rr.tasksCompleted)} completed, ${num(rr.tasksFailed)} failed`
      : `${num(p.tasksCompleted)} completed, ${num(p.tasksFailed)} failed of ${num(p.tasksTotal)}`],
    ['Converged', p.converged != null ? yesNo(p.converged) : null],
    ['Full regeneration', D.plan && D.plan.fullRegenerate ? D.plan.fullRegenerateReason || 'yes' : null],
    ['Escalated', D.escalation ? D.escalation.reason || 'yes' : null],
    ['Stop reason', rr.stopReason || (D.convergence && D.convergence.reason) || null],
  ]));

  patch(e.sparkline, v.scores, () => sparkline(v.scores));
  e.sparkline.setAttribute('aria-label', v.scores.length
    ? `Score history: ${v.scores.map((x) => x.toFixed(3)).join(', ')}` : 'No scores yet');
  e.sparkCaption.textContent = v.scores.length
    ? `Scores: ${v.scores.map((x) => x.toFixed(3)).join(' → ')} (dashed line: 0.85)`
    : 'No judged score yet.';

  patch(e.agreement, plan ? plan.consolidation || null : null, () => agreementNodes(plan));
  const estimated = plan ? num(plan.estimatedTokens) : null;
  patch(e.tokens, [estimated, v.tokensUsed, v.tokenLimit], () => [
    h('p', 'Estimated ', h('strong', estimated == null ? '—' : String(estimated)),
      ' tokens for the current plan vs used ', h('strong', String(v.tokensUsed)),
      v.tokenLimit ? [' of ', String(v.tokenLimit), ' budget'] : ''),
    v.tokenLimit ? h('progress', {
      max: String(v.tokenLimit), value: String(Math.min(v.tokensUsed, v.tokenLimit)), 'aria-label': 'Tokens used of the budget',
    }) : null,
  ]);
  const conflicts = (plan && plan.consolidation && plan.consolidation.conflicts) || [];
  patch(e.conflicts, conflicts, () => conflicts.map((c) => h('li', {'data-section-id': c.sectionId},
    h('code', c.sectionId), `: ${c.winningCriterion} over ${c.losingCriterion}`,
    c.constraint ? [' — kept as a constraint: ', h('q', c.constraint)] : null)));
  e.conflictsNone.hidden = conflicts.length > 0;

  patch(e.plan, v.tasks, () => planNodes(v.tasks));
  patch(e.locked, v.locked, () => v.locked.map((id) => h('li', {'data-section-id': id}, id)));
  e.lockedNone.hidden = v.locked.length > 0;
  patch(e.issues, v.issues, () => (v.issues.length ? issuesTable(v.issues) : h('p', {class: 'muted'}, 'None.')));
  patch(e.document, [v.sections, [...v.changed], v.locked], () => documentNodes(v.sections, v.changed, new Set(v.locked)));

  const hooks = r ? rr.selfRefined || [] : [...D.hooks.values()];
  e.hooksPanel.hidden = hooks.length === 0;
  patch(e.hooks, hooks, () => hooks.map((x) => selfRefinedNode(x, `hook/${x.target}`)));
}

function bestEffortBanner(be) {
  const hints = be.improvementHints || [];
  const categories = be.unresolvedCategories || [];
  return h('div', {id: 'banner-best-effort', class: 'banner warn', role: 'note'},
    h('h3', 'Best-effort result'),
    h('p', 'The run ended below its quality thresholds and returned its best iteration.'),
    h('p', 'Quality: ', h('strong', {class: 'quality', 'data-quality': be.quality || ''}, enumLabel(be.quality, 'QUALITY_STATUS_')),
      ` · best score ${fmtScore(be.bestScore)} at iteration ${num(be.bestIteration)}`,
      be.unresolvedIssuesCount != null ? ` · ${plural(num(be.unresolvedIssuesCount), 'unresolved issue')}` : ''),
    categories.length ? h('p', 'Unresolved: ', categories.join(', ')) : null,
    hints.length ? [h('h4', 'Improvement hints'), h('ul', {class: 'hints'}, hints.map((x) => h('li', {class: 'hint'}, x)))] : null);
}

function agreementNodes(plan) {
  const c = plan && plan.consolidation;
  if (!c) return ['No plan yet.'];
  const alpha = c.alpha != null
    ? `α = ${Number(c.alpha).toFixed(3)}`
    : `α undefined${c.alphaUndefinedReason ? ` (${c.alphaUndefinedReason})` : ''}`;
  return [
    'Agreement: ', h('strong', alpha), ' · ', h('strong', {class: 'level', 'data-level': c.agreement || ''},
      `${enumLabel(c.agreement, 'AGREEMENT_LEVEL_')} agreement`),
    c.flaggedForReview ? [' · ', tag('flagged for review', 'warn')] : null,
    h('span', {class: 'muted small block'},
      `${plural((c.issues || []).length, 'issue')} kept, ${num(c.issuesMerged)} merged, ${num(c.issuesDropped)} dropped`),
  ];
}

function sparkline(scores) {
  if (!scores.length) return [];
  const W = 240;
  const H = 64;
  const P = 6;
  const vals = scores.map((x) => (Number.isFinite(x) ? x : 0));
  let lo = Math.min(...vals) - 0.05;
  let hi = Math.max(...vals) + 0.05;
  if (hi - lo < 0.2) {
    const mid = (hi + lo) / 2;
    lo = mid - 0.1;
    hi = mid + 0.1;
  }
  const x = (i) => (vals.length === 1 ? W / 2 : P + (i * (W - 2 * P)) / (vals.length - 1));
  const y = (v) => H - P - ((v - lo) / (hi - lo)) * (H - 2 * P);
  const nodes = [];
  if (lo <= 0.85 && 0.85 <= hi) {
    nodes.push(s('line', {class: 'threshold', x1: 0, x2: W, y1: y(0.85).toFixed(1), y2: y(0.85).toFixed(1)}));
  }
  if (vals.length > 1) {
    nodes.push(s('polyline', {class: 'line', points: vals.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(' ')}));
  }
  vals.forEach((v, i) => nodes.push(s('circle', {
    class: i === vals.length - 1 ? 'point last' : 'point', cx: x(i).toFixed(1), cy: y(v).toFixed(1), r: 3.5,
  }, s('title', `${i === 0 ? 'as given' : `iteration ${i}`}: ${v.toFixed(3)}`))));
  return nodes;
}

function planNodes(tasks) {
  if (!tasks.length) return h('p', {class: 'muted'}, 'No tasks in the current plan.');
  const batches = new Map();
  for (const t of tasks) {
    const b = num(t.batchIndex);
    if (!batches.has(b)) batches.set(b, []);
    batches.get(b).push(t);
  }
  return [...batches.keys()].sort((a, b) => a - b).map((b) => {
    const list = batches.get(b);
    const counts = new Map();
    for (const t of list) counts.set(t.status, (counts.get(t.status) || 0) + 1);
    const summary = [...counts].map(([st, n]) => `${n} ${enumLabel(st, 'TASK_STATUS_')}`).join(', ');
    return h('div', {class: 'batch', 'data-batch': String(b)},
      h('h4', `Batch ${b + 1}`, h('span', {class: 'muted'}, ` · ${plural(list.length, 'task')} · ${summary}`)),
      table(['Section', 'Action', 'Priority', 'Criterion', 'Status', 'Instruction', 'Lock', 'Edits', 'Detail'],
        list.map(taskRow), 'tasks'));
  });
}

function taskRow(t) {
  const task = t.task || {};
  const status = t.status || 'TASK_STATUS_UNSPECIFIED';
  const constraints = task.constraints || [];
  return h('tr', {
    class: ['task', t.locked && 'locked'], 'data-task-id': task.id || '', 'data-section-id': task.sectionId || '',
    'data-status': status,
  },
  h('td', {class: 'section'}, task.sectionId),
  h('td', {class: 'action'}, enumLabel(task.action, 'FIX_ACTION_')),
  h('td', {class: 'priority num'}, task.priority ? String(task.priority) : '—'),
  h('td', {class: 'criterion'}, task.criterion || '—',
    task.severity && task.severity !== 'SEVERITY_UNSPECIFIED' ? [' ', tag(enumLabel(task.severity, 'SEVERITY_'), 'sev')] : null),
  h('td', {class: 'status'}, h('span', {class: 'badge', 'data-status': status}, enumLabel(status, 'TASK_STATUS_'))),
  h('td', {class: 'instruction'}, h('div', {class: 'text'}, task.instruction || '—'),
    constraints.length ? h('ul', {class: 'constraints'}, constraints.map((c) => h('li', c))) : null),
  h('td', {class: 'lock'}, t.locked ? 'locked' : '—'),
  h('td', {class: 'edits num'}, String(num(t.editCount))),
  h('td', {class: 'detail'}, t.detail || ''));
}

function issuesTable(issues) {
  return table(['Severity', 'Criterion', 'Section', 'Description', 'Fix instruction'], issues.map((i) => h('tr',
    h('td', enumLabel(i.severity, 'SEVERITY_')), h('td', i.criterion), h('td', i.sectionId || '—'),
    h('td', {class: 'text'}, i.description), h('td', {class: 'text'}, i.fixInstruction))), 'issues');
}

function documentNodes(sections, changed, locked) {
  if (!sections.length) return h('p', {class: 'muted'}, 'No document yet.');
  return sections.map((sec) => h('article', {
    class: ['doc-section', changed.has(sec.id) && 'changed', locked.has(sec.id) && 'locked'], 'data-section-id': sec.id,
  },
  h('header', h('h4', {class: 'title'}, sec.title || sec.id),
    h('span', {class: 'tags'}, h('code', sec.id), changed.has(sec.id) ? tag('changed', 'changed') : null,
      locked.has(sec.id) ? tag('locked', 'locked') : null)),
  h('div', {class: 'content'}, sec.content || '')));
}
