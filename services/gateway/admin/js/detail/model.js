/*
 * Assay admin page, run detail: the model of one opened run (pure, no DOM). What events carry
 * (plans, stage artifacts, passes, record counts) is gathered here, and an event newer than the
 * latest GetRun snapshot is applied on top of it until the next snapshot says it all.
 */

import {EVENT_MEMBERS, REFINEMENT_MEMBERS, REFRESH_AFTER} from '../constants.js';
import {num, snake} from '../format.js';

/**
 * One opened run. `run` is the latest GetRun snapshot (it covers events up to snapSeq) with
 * the live events after it applied on top; the other fields are gathered from every event.
 * Record results are counted, not kept (a run may hold millions): the table of a checklist
 * evaluation reads them a page at a time (ListRunResults, detail/checklist_eval.js), `pageSize`
 * rows a page (0: the default).
 */
export function newDetail(id, pageSize = 0) {
  return {
    id, kind: '', closed: false, abort: new AbortController(), pageSize,
    run: null, snapSeq: 0, lastSeq: 0, completed: false, streamFatal: false, streamError: null, liveEvents: [],
    refreshTimer: 0, renderTimer: 0, busy: false,
    plan: null, escalation: null, bestEffort: null, convergence: null,
    recordsScored: 0, recordsFailed: 0, results: null, aggregate: null, checklists: new Map(), stageProgress: null,
    comparisonUpdates: [],
    problems: new Map(), problemEls: new Map(), passes: new Map(), hooks: new Map(),
    pendingLog: [], eventCount: 0,
    edit: {sectionId: '', prefill: null},
    els: {},
  };
}

/** Which oneof member an event carries; `kind` is what the log shows and data-kind holds. */
export function classify(ev) {
  const member = EVENT_MEMBERS.find((m) => ev[m] != null) || '';
  if (member !== 'refinement') return {member, inner: '', kind: member || 'unknown'};
  const inner = REFINEMENT_MEMBERS.find((m) => ev.refinement[m] != null) || '';
  return {member, inner, kind: inner ? snake(inner) : 'refinement'};
}

function problemEntry(D, id, index) {
  const key = id || `#${num(index) + 1}`;
  if (!D.problems.has(key)) D.problems.set(key, {id: key, index: num(index), stages: [], done: null});
  return D.problems.get(key);
}

/** Facts only events carry (plans, stage artifacts, passes, record counts). */
export function gather(D, ev, k) {
  const x = ev[k.member];
  switch (k.member) {
    case 'refinement': {
      const y = x[k.inner];
      if (k.inner === 'refinementStart' || k.inner === 'iterationStarted') D.plan = y;
      else if (k.inner === 'escalationTriggered') D.escalation = y;
      else if (k.inner === 'bestEffortSelected') D.bestEffort = y.bestEffort || {};
      else if (k.inner === 'convergenceDetected') D.convergence = y;
      break;
    }
    case 'recordScored':
      // each record is reported once (events are deduplicated by sequence)
      D.recordsScored += 1;
      if (x.error || !x.score) D.recordsFailed += 1;
      break;
    case 'aggregate': D.aggregate = x.aggregate || null; break;
    case 'comparisonUpdated': D.comparisonUpdates.push(x); break;
    case 'checklistReady': D.checklists.set(x.checklist?.id || `#${D.checklists.size + 1}`, x.checklist || {}); break;
    case 'progress': D.stageProgress = x; break;
    case 'selfRefinePass': D.passes.set(num(x.pass), x); break;
    case 'debateStage': problemEntry(D, x.problemId, x.index).stages.push(x.stage || {}); break;
    case 'debateProblemDone': problemEntry(D, x.id, x.index).done = x; break;
    case 'selfRefined': D.hooks.set(x.target, x); break;
    default: break;
  }
}

/**
 * Apply an event newer than the snapshot to it. True when the event changed what only a snapshot
 * holds in full (tasks, sections, state): the first time it is applied, a GetRun should follow.
 */
export function applyLive(D, ev) {
  const run = D.run;
  const k = classify(ev);
  let refresh = false;
  if (k.member === 'stateChanged') {
    run.state = ev.stateChanged.state;
    refresh = true;
  } else if (k.member === 'completed') {
    run.state = ev.completed.state;
    if (ev.completed.result) run.result = ev.completed.result;
    refresh = true;
  } else if (k.member === 'recordsClaimed') {
    refresh = true; // the gateways' shares (GetRun) changed
  } else if (k.member === 'refinement') {
    const x = ev.refinement[k.inner];
    applyRefinement(run.refinement, ev.refinement.iteration, k.inner, x);
    refresh = REFRESH_AFTER.has(k.inner)
      || (k.inner === 'verificationResult' && (!x.accepted || x.rolledBack || x.humanEdit));
  }
  return refresh;
}

/** What a refinement event changes in RefinementProgress, until the next GetRun says it all. */
function applyRefinement(p, iteration, inner, x) {
  if (!p || !x) return;
  const tasks = p.tasks || [];
  const sectionTasks = (id) => tasks.filter((t) => t.task && t.task.sectionId === id);
  const addId = (field, id) => {
    if (!id) return;
    p[field] = p[field] || [];
    if (!p[field].includes(id)) p[field].push(id);
  };
  switch (inner) {
    case 'refinementStart':
    case 'iterationStarted':
      p.iteration = iteration;
      if (x.lockedSectionIds) p.lockedSectionIds = x.lockedSectionIds;
      break;
    case 'taskStarted': {
      const t = tasks.find((y) => y.task && x.task && y.task.id === x.task.id);
      if (t) t.status = 'TASK_STATUS_RUNNING';
      break;
    }
    case 'patchApplied': {
      if (x.section && p.sections) {
        const i = p.sections.findIndex((sec) => sec.id === x.sectionId);
        if (i >= 0) p.sections[i] = {...p.sections[i], ...x.section};
      }
      addId('changedSectionIds', x.sectionId);
      break;
    }
    case 'verificationResult': {
      const t = x.taskId && tasks.find((y) => y.task && y.task.id === x.taskId);
      if (t) {
        t.status = x.accepted ? 'TASK_STATUS_APPLIED' : x.verification ? 'TASK_STATUS_REJECTED' : 'TASK_STATUS_FAILED';
        if (x.reason) t.detail = x.reason;
      }
      for (const y of sectionTasks(x.sectionId)) y.editCount = x.editCount;
      break;
    }
    case 'sectionLocked':
      addId('lockedSectionIds', x.sectionId);
      for (const y of sectionTasks(x.sectionId)) y.locked = true;
      break;
    case 'iterationComplete':
      p.scoreHistory = x.scoreHistory || p.scoreHistory;
      p.tokensUsed = x.tokensUsed;
      break;
    case 'convergenceDetected':
      if (x.scoreHistory && x.scoreHistory.length) p.scoreHistory = x.scoreHistory;
      p.converged = true;
      break;
    default: break;
  }
}
