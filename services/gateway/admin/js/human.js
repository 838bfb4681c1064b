/*
 * Assay admin page: the human loop, i.e. a run's controls (ControlRun with an actor and a reason
 * for the audit log): pause / resume / cancel for every run; for a targeted refinement Intervene,
 * edit a section, accept the current content and mark it as reviewed; Delete (DeleteRun) once a run
 * has finished.
 */

import {ACTIONS, ACTOR_KEY, AWAITING, PAUSED, PENDING, REFINEMENT, RUNNING, TERMINAL} from './constants.js';
import {api, errorNodes} from './api.js';
import {app} from './page.js';
import {h, panel} from './render.js';
import {refinementView} from './detail/targeted_refinement.js';

function loadActor() {
  try {
    return localStorage.getItem(ACTOR_KEY) || 'admin';
  } catch {
    return 'admin';
  }
}

function saveActor(actor) {
  try {
    localStorage.setItem(ACTOR_KEY, actor || 'admin');
  } catch { /* storage unavailable */ }
}

/**
 * The controls panel of run D; `after` = {refresh(D, delay), render(D)} (detail/run.js): what follows
 * a control the gateway took.
 */
export function buildControls(D, after) {
  const e = D.els;
  const isRefinement = D.kind === REFINEMENT;
  e.actor = h('input', {id: 'actor', type: 'text', autocomplete: 'off', spellcheck: 'false', maxlength: '200'});
  e.actor.value = loadActor();
  e.actor.addEventListener('change', () => saveActor(e.actor.value.trim()));
  e.reason = h('input', {
    id: 'reason', type: 'text', autocomplete: 'off', maxlength: '2000', placeholder: 'Why (written to the audit log)',
  });
  const button = (id, text, action, cls) => h('button', {
    type: 'button', id, class: cls, onclick: () => control(D, after, action),
  }, text);
  e.btn = {};
  if (isRefinement) e.btn.intervene = button('btn-intervene', 'Intervene', 'pause', 'primary');
  e.btn.pause = button('btn-pause', 'Pause', 'pause');
  e.btn.resume = button('btn-resume', 'Resume', 'resume');
  if (isRefinement) {
    e.btn.accept = button('btn-accept', 'Accept current', 'accept');
    e.btn.review = button('btn-review', 'Mark as reviewed', 'review');
  }
  e.btn.cancel = button('btn-cancel', 'Cancel run', 'cancel', 'danger');
  e.btn.delete = h('button', {type: 'button', id: 'btn-delete', class: 'danger', onclick: () => remove(D, after)},
    'Delete run');
  e.controlError = h('div', {id: 'control-error', class: 'error', role: 'alert'});
  e.controlStatus = h('p', {id: 'control-status', class: 'muted', role: 'status'});

  const children = [
    h('div', {class: 'fields'},
      h('label', {for: 'actor'}, 'Actor'), e.actor,
      h('label', {for: 'reason'}, 'Reason'), e.reason),
    h('div', {class: 'buttons', role: 'group', 'aria-label': 'Run actions'}, Object.values(e.btn)),
    h('p', {class: 'help'}, isRefinement
      ? 'Intervene pauses after the current task. Edit, accept or resume while paused or awaiting a human; mark as reviewed only when awaiting a human.'
      : 'Pause while running, resume while paused; cancel until the run finishes, delete once it has.'),
  ];
  if (isRefinement) {
    e.editSection = h('select', {id: 'edit-section'});
    e.editContent = h('textarea', {id: 'edit-content', rows: '7', spellcheck: 'true'});
    e.btn.edit = h('button', {
      type: 'button', id: 'btn-edit',
      onclick: () => control(D, after, 'editSection', {sectionId: e.editSection.value, content: e.editContent.value}),
    }, 'Save section edit');
    e.editSection.addEventListener('change', () => {
      D.edit.sectionId = e.editSection.value;
      D.edit.prefill = null;
      fillEditor(D, true);
      updateControls(D);
    });
    children.push(h('fieldset', {class: 'edit'},
      h('legend', 'Edit a section'),
      h('label', {for: 'edit-section'}, 'Section'), e.editSection,
      h('label', {for: 'edit-content'}, 'Content'), e.editContent,
      h('div', {class: 'buttons'}, e.btn.edit)));
  }
  children.push(e.controlError, e.controlStatus);
  return panel('Controls', h('div', {class: 'controls'}, children));
}

export function updateControls(D) {
  const {run, els: e} = D;
  const st = run.state || '';
  const humanTurn = st === PAUSED || st === AWAITING;
  const allowed = {
    pause: st === RUNNING || st === PENDING,
    intervene: st === RUNNING || st === PENDING,
    resume: humanTurn,
    accept: humanTurn,
    review: st === AWAITING,
    cancel: !TERMINAL.has(st),
    delete: TERMINAL.has(st),
    edit: humanTurn,
  };
  if (e.editSection) {
    syncEditOptions(D);
    allowed.edit = humanTurn && Boolean(e.editSection.value);
  }
  for (const [name, btn] of Object.entries(e.btn)) btn.disabled = D.busy || !allowed[name];
}

function syncEditOptions(D) {
  const sel = D.els.editSection;
  const sections = refinementView(D).sections;
  const sig = JSON.stringify(sections.map((sec) => [sec.id, sec.title]));
  if (sel.assaySig !== sig) {
    sel.assaySig = sig;
    const keep = sel.value || D.edit.sectionId;
    sel.replaceChildren(...sections.map((sec) => new Option(sec.title ? `${sec.id} — ${sec.title}` : sec.id, sec.id)));
    if (sections.some((sec) => sec.id === keep)) sel.value = keep;
  }
  if (sel.value !== D.edit.sectionId) {
    D.edit.sectionId = sel.value;
    D.edit.prefill = null;
    fillEditor(D, true);
  } else {
    fillEditor(D, false);
  }
}

/** Prefill the editor with the section's current content unless the user changed the text. */
function fillEditor(D, force) {
  const area = D.els.editContent;
  const userText = D.edit.prefill != null && area.value !== D.edit.prefill;
  if (!force && userText) return;
  const sec = refinementView(D).sections.find((x) => x.id === D.els.editSection.value);
  const content = sec ? sec.content || '' : '';
  if (area.value !== content) area.value = content;
  D.edit.prefill = content;
}

async function control(D, after, action, payload = {}) {
  const e = D.els;
  const actor = e.actor.value.trim() || 'admin';
  saveActor(actor);
  const body = {runId: D.id, [action]: payload, actor, reason: e.reason.value.trim()};
  const [pending, done] = ACTIONS[action];
  D.busy = true;
  updateControls(D);
  e.controlError.replaceChildren();
  e.controlStatus.textContent = pending;
  try {
    const res = await api('ControlRun', body);
    if (app.view !== D) return;
    if (res.run && res.run.state) D.run.state = res.run.state;
    e.controlStatus.textContent = done;
    if (action === 'editSection') D.edit.prefill = payload.content;
    after.refresh(D, 0);
  } catch (err) {
    if (app.view !== D || err.unauthorized) return;
    e.controlStatus.textContent = '';
    e.controlError.replaceChildren(...errorNodes(err));
  } finally {
    if (app.view === D) {
      D.busy = false;
      after.render(D);
    }
  }
}

/** Delete finished run D (after a confirmation): its events and audit entries go with it. */
async function remove(D, after) {
  const e = D.els;
  if (!window.confirm(`Delete run ${D.id} with its events and audit log? This cannot be undone.`)) return;
  D.busy = true;
  updateControls(D);
  e.controlError.replaceChildren();
  e.controlStatus.textContent = 'Deleting…';
  try {
    await api('DeleteRun', {runId: D.id});
    if (app.view !== D) return;
    D.deleted = true;
    location.hash = '#/';
  } catch (err) {
    if (app.view !== D || err.unauthorized) return;
    e.controlStatus.textContent = '';
    e.controlError.replaceChildren(...errorNodes(err));
  } finally {
    if (app.view === D && !D.deleted) {
      D.busy = false;
      after.render(D);
    }
  }
}
