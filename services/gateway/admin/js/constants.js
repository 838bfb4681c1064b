/*
 * Assay admin page: the contract's enum names the page knows, storage keys, timings and caps.
 */

export const RUN_STATES = [
  'RUN_STATE_PENDING', 'RUN_STATE_RUNNING', 'RUN_STATE_PAUSED', 'RUN_STATE_AWAITING_HUMAN',
  'RUN_STATE_SUCCEEDED', 'RUN_STATE_PARTIAL', 'RUN_STATE_FAILED', 'RUN_STATE_CANCELLED',
];
export const KINDS = [
  'PIPELINE_KIND_CHECKLIST_EVAL', 'PIPELINE_KIND_GENERATE_CHECKLIST',
  'PIPELINE_KIND_TARGETED_REFINEMENT', 'PIPELINE_KIND_SELF_REFINE', 'PIPELINE_KIND_DEBATE',
];
export const TERMINAL = new Set(['RUN_STATE_SUCCEEDED', 'RUN_STATE_PARTIAL', 'RUN_STATE_FAILED', 'RUN_STATE_CANCELLED']);
export const RUNNING = 'RUN_STATE_RUNNING';
export const PENDING = 'RUN_STATE_PENDING';
export const PAUSED = 'RUN_STATE_PAUSED';
export const AWAITING = 'RUN_STATE_AWAITING_HUMAN';
export const REFINEMENT = 'PIPELINE_KIND_TARGETED_REFINEMENT';

// RunEvent's oneof members (JSON names) and RefinementEvent's.
export const EVENT_MEMBERS = [
  'started', 'progress', 'checklistReady', 'recordScored', 'aggregate', 'refinement',
  'selfRefinePass', 'debateStage', 'stateChanged', 'completed', 'debateProblemDone', 'selfRefined',
  'recordsClaimed', 'comparisonUpdated',
];
export const REFINEMENT_MEMBERS = [
  'refinementStart', 'batchStarted', 'taskStarted', 'patchApplied', 'verificationResult',
  'batchComplete', 'sectionLocked', 'iterationComplete', 'convergenceDetected',
  'bestEffortSelected', 'escalationTriggered', 'refinementComplete', 'judged', 'consistencyChecked',
  'iterationStarted', 'patchRejected',
];
// Refinement events after which the snapshot (tasks, phase, sections) is fetched again.
export const REFRESH_AFTER = new Set([
  'refinementStart', 'iterationStarted', 'batchStarted', 'batchComplete', 'iterationComplete', 'convergenceDetected',
  'bestEffortSelected', 'escalationTriggered', 'refinementComplete', 'judged',
]);
// Stream errors that a reconnect cannot fix.
export const FATAL_CODES = new Set([
  'NOT_FOUND', 'INVALID_ARGUMENT', 'PERMISSION_DENIED', 'FAILED_PRECONDITION', 'UNIMPLEMENTED', 'OUT_OF_RANGE',
]);

export const TOKEN_KEY = 'assay.admin.token';
export const ACTOR_KEY = 'assay.admin.actor';
export const LIST_REFRESH_MS = 2000;
export const RECONNECT_MS = 1000;
export const REFRESH_DEBOUNCE_MS = 300;
export const RENDER_DELAY_MS = 50;
export const EVENT_LOG_CAP = 500;
// A checklist evaluation's record table (ListRunResults, a page at a time): the rows of a page
// (`#/runs/<id>?page_size=N` sets another, 1..RESULTS_PAGE_MAX), the most the gateway serves in
// one page, and how often the page shown is read again while records are being scored.
export const RESULTS_PAGE_SIZE = 100;
export const RESULTS_PAGE_MAX = 10000;
export const RESULTS_REFRESH_MS = 1000;

export const ACTIONS = {
  pause: ['Pausing…', 'Pause requested: the run stops after its current step.'],
  resume: ['Resuming…', 'Resumed.'],
  cancel: ['Cancelling…', 'Cancel requested.'],
  accept: ['Accepting…', 'The current content was accepted as final.'],
  review: ['Marking as reviewed…', 'Marked as reviewed.'],
  editSection: ['Saving the edit…', 'Section edited; it is verified when the run resumes.'],
};
