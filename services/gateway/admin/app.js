/*
 * Assay admin page: app.js
 *
 * The whole client of the gateway's admin page, in plain ES2020 with no dependencies. It talks to
 * the gateway's HTTP face of GatewayService (same origin):
 *   GET  /api/config                     -> {authRequired}
 *   POST /api/ListRuns|GetRun|ControlRun|CompareRuns -> proto3 JSON in and out (64-bit integers as strings)
 *   GET  /api/WatchRun?run_id&after_sequence -> server-sent events, one RunEvent per message
 * with `Authorization: Bearer <token>` on every call when a token is held (sessionStorage). The
 * token comes from the URL the gateway prints (`/#token=...`, read once at start and dropped from
 * the address bar and history) or from the token prompt.
 *
 * Views (hash routing): "#/" lists every run, refreshed every 2 s while visible; "#/runs/<id>"
 * shows one run: a GetRun snapshot, then its events from sequence 0 over one streamed fetch
 * (reconnecting after 1 s from the last sequence seen), with a debounced GetRun after events that
 * change what only the snapshot holds (tasks, sections, state). "#/compare/<baseline>/<candidate>"
 * compares two checklist evaluations (CompareRuns): both means, the difference with its interval as
 * a forest plot (SVG), method and p-value, the flipped items and the worst records.
 *
 * Safety: data (run labels, model output, record text, errors) only ever reaches the page through
 * textContent, createElement, setAttribute and form values: never through HTML parsing.
 */
'use strict';

(() => {
  // ---------------------------------------------------------------- constants

  const RUN_STATES = [
    'RUN_STATE_PENDING', 'RUN_STATE_RUNNING', 'RUN_STATE_PAUSED', 'RUN_STATE_AWAITING_HUMAN',
    'RUN_STATE_SUCCEEDED', 'RUN_STATE_PARTIAL', 'RUN_STATE_FAILED', 'RUN_STATE_CANCELLED',
  ];
  const KINDS = [
    'PIPELINE_KIND_CHECKLIST_EVAL', 'PIPELINE_KIND_GENERATE_CHECKLIST',
    'PIPELINE_KIND_TARGETED_REFINEMENT', 'PIPELINE_KIND_SELF_REFINE', 'PIPELINE_KIND_DEBATE',
  ];
  const TERMINAL = new Set(['RUN_STATE_SUCCEEDED', 'RUN_STATE_PARTIAL', 'RUN_STATE_FAILED', 'RUN_STATE_CANCELLED']);
  const RUNNING = 'RUN_STATE_RUNNING';
  const PENDING = 'RUN_STATE_PENDING';
  const PAUSED = 'RUN_STATE_PAUSED';
  const AWAITING = 'RUN_STATE_AWAITING_HUMAN';
  const REFINEMENT = 'PIPELINE_KIND_TARGETED_REFINEMENT';

  // RunEvent's oneof members (JSON names) and RefinementEvent's.
  const EVENT_MEMBERS = [
    'started', 'progress', 'checklistReady', 'recordScored', 'aggregate', 'refinement',
    'selfRefinePass', 'debateStage', 'stateChanged', 'completed', 'debateProblemDone', 'selfRefined',
  ];
  const REFINEMENT_MEMBERS = [
    'refinementStart', 'batchStarted', 'taskStarted', 'patchApplied', 'verificationResult',
    'batchComplete', 'sectionLocked', 'iterationComplete', 'convergenceDetected',
    'bestEffortSelected', 'escalationTriggered', 'refinementComplete', 'judged',
  ];
  // Refinement events after which the snapshot (tasks, phase, sections) is fetched again.
  const REFRESH_AFTER = new Set([
    'refinementStart', 'batchStarted', 'batchComplete', 'iterationComplete', 'convergenceDetected',
    'bestEffortSelected', 'escalationTriggered', 'refinementComplete', 'judged',
  ]);
  // Stream errors that a reconnect cannot fix.
  const FATAL_CODES = new Set([
    'NOT_FOUND', 'INVALID_ARGUMENT', 'PERMISSION_DENIED', 'FAILED_PRECONDITION', 'UNIMPLEMENTED', 'OUT_OF_RANGE',
  ]);

  const TOKEN_KEY = 'assay.admin.token';
  const ACTOR_KEY = 'assay.admin.actor';
  const LIST_REFRESH_MS = 2000;
  const RECONNECT_MS = 1000;
  const REFRESH_DEBOUNCE_MS = 300;
  const RENDER_DELAY_MS = 50;
  const EVENT_LOG_CAP = 500;
  const RECORD_ROWS_CAP = 500;

  const ACTIONS = {
    pause: ['Pausing…', 'Pause requested: the run stops after its current step.'],
    resume: ['Resuming…', 'Resumed.'],
    cancel: ['Cancelling…', 'Cancel requested.'],
    accept: ['Accepting…', 'The current content was accepted as final.'],
    review: ['Marking as reviewed…', 'Marked as reviewed.'],
    editSection: ['Saving the edit…', 'Section edited; it is verified when the run resumes.'],
  };

  // ---------------------------------------------------------------- DOM helpers

  /** An element: h('p', {class: 'x', 'data-id': id}, 'text', node, [more]). Strings become text. */
  function h(tag, props, ...children) {
    const el = document.createElement(tag);
    return build(el, props, children);
  }

  /** The SVG counterpart of h(). */
  function s(tag, props, ...children) {
    const el = document.createElementNS('http://www.w3.org/2000/svg', tag);
    return build(el, props, children);
  }

  function build(el, props, children) {
    if (props == null || typeof props !== 'object' || props instanceof Node || Array.isArray(props)) {
      children.unshift(props);
    } else {
      for (const [key, value] of Object.entries(props)) {
        if (value == null || value === false) continue;
        if (key === 'class') {
          const cls = Array.isArray(value) ? value.filter(Boolean).join(' ') : value;
          if (cls) el.setAttribute('class', cls);
        } else if (key.startsWith('on') && typeof value === 'function') {
          el.addEventListener(key.slice(2), value);
        } else {
          el.setAttribute(key, value === true ? '' : String(value));
        }
      }
    }
    for (const child of children.flat(Infinity)) {
      if (child == null || child === false || child === '') continue;
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }

  /**
   * Render el's children from data, only when data changed. The new nodes are merged into the
   * existing ones (morph), so unchanged elements keep their identity, focus and <details> state.
   */
  function patch(el, data, render) {
    const sig = JSON.stringify(data === undefined ? null : data);
    if (el.assaySig === sig) return;
    el.assaySig = sig;
    const nodes = [render()].flat(Infinity)
      .filter((n) => n != null && n !== false && n !== '')
      .map((n) => (n instanceof Node ? n : document.createTextNode(String(n))));
    morphChildren(el, nodes);
  }

  /** The identity of an element among its siblings: tag plus its key attribute, if any. */
  function nodeKey(node) {
    if (node.nodeType !== Node.ELEMENT_NODE) return `#${node.nodeType}`;
    for (const attr of ['data-key', 'data-section-id', 'data-problem-id', 'data-task-id', 'data-pass', 'data-batch', 'id']) {
      if (node.hasAttribute(attr)) return `${node.tagName}[${attr}=${node.getAttribute(attr)}]`;
    }
    return node.tagName;
  }

  function morphChildren(parent, nodes) {
    const old = Array.from(parent.childNodes);
    nodes.forEach((node, i) => {
      const prev = old[i];
      if (!prev) parent.append(node);
      else if (nodeKey(prev) === nodeKey(node)) morphNode(prev, node);
      else parent.replaceChild(node, prev);
    });
    for (let i = nodes.length; i < old.length; i += 1) old[i].remove();
  }

  function morphNode(prev, node) {
    if (node.nodeType !== Node.ELEMENT_NODE) {
      if (prev.data !== node.data) prev.data = node.data;
      return;
    }
    for (const {name} of Array.from(prev.attributes)) {
      // a <details> keeps the open state its reader chose
      if (!node.hasAttribute(name) && !(name === 'open' && prev.tagName === 'DETAILS')) prev.removeAttribute(name);
    }
    for (const {name, value} of Array.from(node.attributes)) {
      if (prev.getAttribute(name) !== value) prev.setAttribute(name, value);
    }
    morphChildren(prev, Array.from(node.childNodes));
  }

  let headingIds = 0;
  /** A titled panel of the detail view. */
  function panel(title, ...children) {
    const id = `panel-${++headingIds}`;
    return h('section', {class: 'panel', 'aria-labelledby': id}, h('h3', {id}, title), ...children);
  }

  /** <dt>/<dd> pairs; pairs whose value is null or '' are left out. */
  function kv(pairs) {
    const out = [];
    for (const [term, value] of pairs) {
      if (term == null || value == null || value === '') continue;
      out.push(h('dt', term), h('dd', value));
    }
    return out;
  }

  function table(headers, rows, cls) {
    return h('div', {class: 'table-wrap'},
      h('table', {class: ['grid', cls]},
        h('thead', h('tr', headers.map((t) => h('th', {scope: 'col'}, t)))),
        h('tbody', rows)));
  }

  function tag(text, cls) {
    return h('span', {class: ['tag', cls]}, text);
  }

  function badge(state) {
    return h('span', {class: 'badge', 'data-state': state || ''}, stateLabel(state));
  }

  function timeEl(ts, short) {
    if (!ts) return h('span', {class: 'time'}, '—');
    const d = new Date(ts);
    const text = Number.isNaN(d.getTime()) ? String(ts) : short ? d.toLocaleTimeString() : d.toLocaleString();
    return h('time', {datetime: ts, title: String(ts)}, text);
  }

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  // ---------------------------------------------------------------- formatting

  const num = (v) => {
    const n = Number(v);
    return Number.isFinite(n) ? n : 0;
  };
  const tokensOf = (usage) => (usage ? num(usage.promptTokens) + num(usage.completionTokens) : 0);
  const fmtScore = (v) => (v == null || v === '' || !Number.isFinite(Number(v)) ? '—' : Number(v).toFixed(3));
  const fmtPct = (v) => (v == null || !Number.isFinite(Number(v)) ? '—' : `${(Number(v) * 100).toFixed(1)}%`);
  const yesNo = (b) => (b ? 'yes' : 'no');
  const plural = (n, word, many = `${word}s`) => `${n} ${n === 1 ? word : many}`;
  const snake = (name) => name.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
  const clip = (text, n = 80) => {
    const t = String(text || '').replace(/\s+/g, ' ').trim();
    return t.length > n ? `${t.slice(0, n - 1)}…` : t;
  };
  const firstNonEmpty = (...lists) => lists.find((l) => Array.isArray(l) && l.length) || [];

  /** "RUN_STATE_AWAITING_HUMAN" -> "awaiting human". */
  function enumLabel(value, prefix) {
    if (value == null || value === '') return '—';
    let text = String(value);
    if (prefix && text.startsWith(prefix)) text = text.slice(prefix.length);
    if (text === 'UNSPECIFIED') return '—';
    return text.toLowerCase().replace(/_/g, ' ');
  }
  const stateLabel = (v) => enumLabel(v, 'RUN_STATE_');
  const kindLabel = (v) => enumLabel(v, 'PIPELINE_KIND_');

  /** gRPC codes arrive as "NOT_FOUND" or, from a broken stream, as "NotFound". */
  const normCode = (code) => (code ? String(code).replace(/([a-z])([A-Z])/g, '$1_$2').toUpperCase() : '');

  // ---------------------------------------------------------------- API and authentication

  class ApiError extends Error {
    constructor(code, message, fieldViolations = [], status = 0) {
      super(message);
      this.code = code;
      this.fieldViolations = fieldViolations;
      this.status = status;
    }
    get unauthorized() {
      return this.code === 'UNAUTHENTICATED';
    }
  }

  const app = {authRequired: false, revealed: false, view: null};
  const els = {};

  function getToken() {
    try {
      return sessionStorage.getItem(TOKEN_KEY) || '';
    } catch {
      return '';
    }
  }

  function authHeaders(extra) {
    const headers = {...extra};
    const token = getToken();
    if (token) headers.Authorization = `Bearer ${token}`;
    return headers;
  }

  /** POST /api/<method> with a proto3 JSON body; resolves to the response message. */
  async function api(method, body) {
    let res;
    try {
      res = await fetch(`/api/${method}`, {
        method: 'POST',
        headers: authHeaders({'Content-Type': 'application/json', Accept: 'application/json'}),
        body: JSON.stringify(body || {}),
        cache: 'no-store',
      });
    } catch (err) {
      throw new ApiError('UNAVAILABLE', `cannot reach the gateway (${err.message})`);
    }
    if (!res.ok) throw await failure(res);
    revealApp();
    const text = await res.text();
    try {
      return text ? JSON.parse(text) : {};
    } catch {
      throw new ApiError('INTERNAL', `${method} answered with something that is not JSON`);
    }
  }

  /** The error of a non-2xx answer; a 401 brings the token prompt back. */
  async function failure(res) {
    let body = {};
    try {
      body = JSON.parse(await res.text()) || {};
    } catch {
      body = {};
    }
    const err = new ApiError(
      normCode(body.code) || `HTTP_${res.status}`,
      body.message || res.statusText || 'request failed',
      Array.isArray(body.fieldViolations) ? body.fieldViolations : [],
      res.status,
    );
    if (res.status === 401 || err.unauthorized) {
      err.code = 'UNAUTHENTICATED';
      requireToken(true);
    } else {
      revealApp(); // the server took the credentials: only 401 means it did not
    }
    return err;
  }

  /** The error as readable nodes: code, message, then each field violation. */
  function errorNodes(err) {
    const violations = err.fieldViolations || [];
    return [
      h('strong', {class: 'code'}, err.code || 'ERROR'), ': ', h('span', {class: 'message'}, err.message || ''),
      violations.length ? h('ul', {class: 'violations'}, violations.map((v) =>
        h('li', h('code', v.field || '(request)'), ': ', v.description || ''))) : null,
    ];
  }

  /** Show only the token prompt: drop the token (it was refused or is missing) and every view. */
  function requireToken(refused) {
    const had = Boolean(getToken());
    try {
      sessionStorage.removeItem(TOKEN_KEY);
    } catch { /* storage unavailable */ }
    teardownView();
    list.rows.clear();
    els.runsBody.replaceChildren();
    els.detailView.replaceChildren();
    app.revealed = false;
    els.app.hidden = true;
    els.auth.hidden = false;
    els.authError.textContent = refused && had ? 'The server refused this token (401). Enter a valid one.' : '';
    setStatus('');
    els.token.focus();
  }

  function revealApp() {
    if (app.revealed) return;
    app.revealed = true;
    els.auth.hidden = true;
    els.authError.textContent = '';
    els.app.hidden = false;
    els.logout.hidden = !app.authRequired;
    setStatus('');
  }

  function setStatus(text) {
    els.status.textContent = text;
  }

  // ---------------------------------------------------------------- routing

  function parseRoute() {
    const c = /^#\/compare\/([^/?#]+)\/([^/?#]+)/.exec(location.hash);
    if (c) {
      try {
        return {name: 'compare', baseline: decodeURIComponent(c[1]), candidate: decodeURIComponent(c[2])};
      } catch { /* malformed escape: fall back to the list */ }
    }
    const m = /^#\/runs\/([^/?#]+)/.exec(location.hash);
    if (m) {
      try {
        return {name: 'run', id: decodeURIComponent(m[1])};
      } catch { /* malformed escape: fall back to the list */ }
    }
    return {name: 'list'};
  }

  function route() {
    teardownView();
    const r = parseRoute();
    if (r.name === 'compare') openCompare(r.baseline, r.candidate);
    else if (r.name === 'run') openRun(r.id);
    else openList();
  }

  /** Stop whatever the current view runs: the list's timer, a run's stream and timers. */
  function teardownView() {
    if (list.active) list.scrollY = window.scrollY;
    list.active = false;
    clearTimeout(list.timer);
    compare.gen += 1;
    els.compareView.hidden = true;
    els.compareView.replaceChildren();
    const D = app.view;
    if (D) {
      D.closed = true;
      D.abort.abort();
      clearTimeout(D.refreshTimer);
      clearTimeout(D.renderTimer);
    }
    app.view = null;
  }

  // ---------------------------------------------------------------- runs list

  const list = {active: false, timer: 0, gen: 0, rows: new Map(), lastOpened: '', focusOnLoad: false, scrollY: 0};

  function openList() {
    els.listView.hidden = false;
    els.detailView.hidden = true;
    els.detailView.replaceChildren();
    document.title = 'Runs · Assay admin';
    list.active = true;
    list.focusOnLoad = Boolean(list.lastOpened);
    loadRuns();
  }

  async function loadRuns() {
    clearTimeout(list.timer);
    if (!list.active) return;
    const gen = ++list.gen;
    const request = {pageSize: 200};
    if (els.filterState.value) request.state = els.filterState.value;
    if (els.filterKind.value) request.kind = els.filterKind.value;
    try {
      const res = await api('ListRuns', request);
      if (!list.active || gen !== list.gen) return;
      renderRuns(res.runs || [], Boolean(res.nextPageToken));
      patch(els.listError, null, () => []);
    } catch (err) {
      if (err.unauthorized || !list.active || gen !== list.gen) return;
      // patched, so a failure repeated every 2 s is announced once
      patch(els.listError, [err.code, err.message, err.fieldViolations], () => errorNodes(err));
    }
    scheduleListRefresh();
  }

  /** The only periodic call: ListRuns every 2 s while the list and the tab are visible. */
  function scheduleListRefresh() {
    clearTimeout(list.timer);
    if (list.active && document.visibilityState === 'visible') list.timer = setTimeout(loadRuns, LIST_REFRESH_MS);
  }

  function renderRuns(runs, more) {
    const tbody = els.runsBody;
    const empty = tbody.querySelector('tr.empty');
    if (empty) empty.remove();
    const seen = new Set();
    runs.forEach((run, i) => {
      let tr = list.rows.get(run.runId);
      if (!tr) {
        tr = h('tr', {tabindex: '0', 'data-run-id': run.runId},
          h('td', {class: 'run'}), h('td', {class: 'kind'}), h('td', {class: 'state'}),
          h('td', {class: 'progress'}), h('td', {class: 'started'}), h('td', {class: 'tokens num'}));
        list.rows.set(run.runId, tr);
      }
      updateRunRow(tr, run);
      seen.add(run.runId);
      // Move rows only when out of place, so a focused row keeps its focus.
      if (tbody.children[i] !== tr) tbody.insertBefore(tr, tbody.children[i] || null);
    });
    for (const [id, tr] of list.rows) {
      if (!seen.has(id)) {
        tr.remove();
        list.rows.delete(id);
      }
    }
    if (!runs.length) {
      tbody.append(h('tr', {class: 'empty'}, h('td', {colspan: '6'}, 'No runs match these filters.')));
    }
    const comparable = runs.filter((r) => r.kind === 'PIPELINE_KIND_CHECKLIST_EVAL'
      && (r.state === 'RUN_STATE_SUCCEEDED' || r.state === 'RUN_STATE_PARTIAL'));
    patch(els.evalRuns, comparable.map((r) => [r.runId, r.label]), () => comparable.map((r) =>
      h('option', {value: r.runId}, r.label ? `${r.label} · ${r.runId}` : r.runId)));
    const when = new Date().toLocaleTimeString();
    els.listMeta.textContent = `${plural(runs.length, 'run')}${more ? ' (the newest 200)' : ''} · updated ${when}`;
    if (list.focusOnLoad) {
      // back from a run: where the reader was, on the row they opened
      list.focusOnLoad = false;
      window.scrollTo(0, list.scrollY);
      const row = list.rows.get(list.lastOpened);
      if (row && (document.activeElement === document.body || !document.activeElement)) row.focus({preventScroll: true});
    }
  }

  function updateRunRow(tr, run) {
    tr.dataset.kind = run.kind || '';
    tr.dataset.state = run.state || '';
    const [cRun, cKind, cState, cProgress, cStarted, cTokens] = tr.cells;
    patch(cRun, [run.label, run.runId], () => [
      run.label ? h('span', {class: 'label'}, run.label) : null, h('code', {class: 'id'}, run.runId),
    ]);
    cKind.textContent = kindLabel(run.kind);
    patch(cState, run.state, () => badge(run.state));
    cProgress.textContent = listProgress(run);
    patch(cStarted, run.createdAt, () => timeEl(run.createdAt));
    cTokens.textContent = String(tokensOf(run.usage));
  }

  function listProgress(run) {
    const p = run.refinement;
    if (p) return `iteration ${num(p.iteration)}/${num(p.maxIterations)}${p.phase ? ` · ${p.phase}` : ''}`;
    const total = num(run.recordsTotal);
    return total > 0 ? `${num(run.recordsDone)}/${total}` : '—';
  }

  function openRowRun(tr) {
    list.lastOpened = tr.dataset.runId;
    location.hash = `#/runs/${encodeURIComponent(tr.dataset.runId)}`;
  }

  // ---------------------------------------------------------------- run detail: model

  /**
   * One opened run. `run` is the latest GetRun snapshot (it covers events up to snapSeq) with
   * the live events after it applied on top; the other fields are gathered from every event.
   */
  function newDetail(id) {
    return {
      id, kind: '', closed: false, abort: new AbortController(),
      run: null, snapSeq: 0, lastSeq: 0, completed: false, streamFatal: false, streamError: null, liveEvents: [],
      refreshTimer: 0, renderTimer: 0, busy: false,
      plan: null, escalation: null, bestEffort: null, convergence: null,
      records: new Map(), aggregate: null, checklists: new Map(), stageProgress: null,
      problems: new Map(), problemEls: new Map(), passes: new Map(), hooks: new Map(),
      pendingLog: [], eventCount: 0,
      edit: {sectionId: '', prefill: null},
      els: {},
    };
  }

  async function openRun(id) {
    els.listView.hidden = true;
    els.detailView.hidden = false;
    window.scrollTo(0, 0);
    const D = newDetail(id);
    app.view = D;
    document.title = `Run ${id} · Assay admin`;
    const back = () => h('a', {id: 'back', class: 'back', href: '#/'}, '← All runs');
    els.detailView.replaceChildren(back(), h('p', {class: 'muted'}, 'Loading run ', h('code', id), '…'));
    let res;
    try {
      res = await api('GetRun', {runId: id});
    } catch (err) {
      if (app.view !== D || err.unauthorized) return;
      els.detailView.replaceChildren(back(), h('h2', 'Run ', h('code', id)),
        h('div', {class: 'error', role: 'alert'}, errorNodes(err)));
      return;
    }
    if (app.view !== D) return;
    if (!res.run) {
      els.detailView.replaceChildren(back(), h('p', {class: 'error', role: 'alert'}, 'GetRun returned no run.'));
      return;
    }
    D.kind = res.run.kind || '';
    buildDetail(D, res.run);
    setSnapshot(D, res.run);
    renderDetail(D);
    D.els.title.focus();
    watch(D);
  }

  function setSnapshot(D, run) {
    if (D.run && num(run.lastSequence) < D.snapSeq) return; // an older answer overtaken by a newer one
    D.run = run;
    D.snapSeq = num(run.lastSequence);
    D.liveEvents = D.liveEvents.filter((ev) => num(ev.sequence) > D.snapSeq);
    for (const ev of D.liveEvents) applyLive(D, ev, false);
    scheduleRender(D);
  }

  function scheduleRefresh(D, delay = REFRESH_DEBOUNCE_MS) {
    clearTimeout(D.refreshTimer);
    D.refreshTimer = setTimeout(async () => {
      if (app.view !== D) return;
      try {
        const res = await api('GetRun', {runId: D.id});
        if (app.view === D && res.run) setSnapshot(D, res.run);
      } catch (err) {
        if (app.view === D && !err.unauthorized) setStream(D, 'error', err);
      }
    }, delay);
  }

  function scheduleRender(D) {
    if (D.renderTimer) return;
    D.renderTimer = setTimeout(() => {
      D.renderTimer = 0;
      if (app.view === D) renderDetail(D);
    }, RENDER_DELAY_MS);
  }

  /** Which oneof member an event carries; `kind` is what the log shows and data-kind holds. */
  function classify(ev) {
    const member = EVENT_MEMBERS.find((m) => ev[m] != null) || '';
    if (member !== 'refinement') return {member, inner: '', kind: member || 'unknown'};
    const inner = REFINEMENT_MEMBERS.find((m) => ev.refinement[m] != null) || '';
    return {member, inner, kind: inner ? snake(inner) : 'refinement'};
  }

  function onEvent(D, ev) {
    const seq = num(ev.sequence);
    if (seq && seq <= D.lastSeq) return; // already seen (replayed after a reconnect)
    if (seq) D.lastSeq = seq;
    const k = classify(ev);
    gather(D, ev, k);
    if (seq > D.snapSeq) {
      D.liveEvents.push(ev);
      applyLive(D, ev, true);
    }
    if (k.member === 'completed') D.completed = true;
    D.eventCount += 1;
    D.pendingLog.push(ev);
    scheduleRender(D);
  }

  function problemEntry(D, id, index) {
    const key = id || `#${num(index) + 1}`;
    if (!D.problems.has(key)) D.problems.set(key, {id: key, index: num(index), stages: [], done: null});
    return D.problems.get(key);
  }

  /** Facts only events carry (plans, stage artifacts, passes, record results). */
  function gather(D, ev, k) {
    const x = ev[k.member];
    switch (k.member) {
      case 'refinement': {
        const y = x[k.inner];
        if (k.inner === 'refinementStart') D.plan = y;
        else if (k.inner === 'escalationTriggered') D.escalation = y;
        else if (k.inner === 'bestEffortSelected') D.bestEffort = y.bestEffort || {};
        else if (k.inner === 'convergenceDetected') D.convergence = y;
        break;
      }
      case 'recordScored': D.records.set(num(x.index), x); break;
      case 'aggregate': D.aggregate = x.aggregate || null; break;
      case 'checklistReady': D.checklists.set(x.checklist?.id || `#${D.checklists.size + 1}`, x.checklist || {}); break;
      case 'progress': D.stageProgress = x; break;
      case 'selfRefinePass': D.passes.set(num(x.pass), x); break;
      case 'debateStage': problemEntry(D, x.problemId, x.index).stages.push(x.stage || {}); break;
      case 'debateProblemDone': problemEntry(D, x.id, x.index).done = x; break;
      case 'selfRefined': D.hooks.set(x.target, x); break;
      default: break;
    }
  }

  /** Apply an event newer than the snapshot to it; `fresh` = first time (may ask for a GetRun). */
  function applyLive(D, ev, fresh) {
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
    } else if (k.member === 'refinement') {
      const x = ev.refinement[k.inner];
      applyRefinement(run.refinement, ev.refinement.iteration, k.inner, x);
      refresh = REFRESH_AFTER.has(k.inner)
        || (k.inner === 'verificationResult' && (!x.accepted || x.rolledBack || x.humanEdit));
    }
    if (fresh && refresh) scheduleRefresh(D);
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

  // ---------------------------------------------------------------- run detail: event stream

  /** Follow WatchRun: fetch + reader (EventSource cannot send the bearer), reconnecting on drops. */
  async function watch(D) {
    while (!D.closed) {
      setStream(D, D.lastSeq ? 'reconnecting' : 'connecting', D.streamError);
      try {
        const url = `/api/WatchRun?run_id=${encodeURIComponent(D.id)}&after_sequence=${D.lastSeq}`;
        const res = await fetch(url, {
          headers: authHeaders({Accept: 'text/event-stream'}), signal: D.abort.signal, cache: 'no-store',
        });
        if (!res.ok) throw await failure(res);
        D.streamError = null;
        setStream(D, 'live');
        await readSse(res.body, (name, data) => onSse(D, name, data));
      } catch (err) {
        if (D.closed || (err && err.name === 'AbortError')) return;
        if (err instanceof ApiError) {
          if (err.unauthorized) return;
          if (FATAL_CODES.has(err.code)) D.streamFatal = true;
          D.streamError = err;
          setStream(D, 'error', err);
        } else {
          D.streamError = new ApiError('UNAVAILABLE', `the event stream dropped (${err && err.message})`);
        }
      }
      if (D.closed) return;
      if (D.completed) {
        setStream(D, 'finished');
        return;
      }
      if (D.streamFatal) return;
      setStream(D, 'reconnecting', D.streamError);
      await sleep(RECONNECT_MS);
    }
  }

  /** A minimal text/event-stream reader: calls onMessage(eventName, data) per message. */
  async function readSse(body, onMessage) {
    const reader = body.getReader();
    const decoder = new TextDecoder();
    let buffer = '';
    let name = '';
    let data = [];
    const onLine = (line) => {
      if (line === '') {
        if (data.length) onMessage(name || 'message', data.join('\n'));
        name = '';
        data = [];
        return;
      }
      if (line[0] === ':') return; // keep-alive comment
      const colon = line.indexOf(':');
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? '' : line.slice(colon + 1);
      if (value[0] === ' ') value = value.slice(1);
      if (field === 'data') data.push(value);
      else if (field === 'event') name = value;
      // `id` repeats the sequence the JSON carries; `retry` is ignored (reconnects wait 1 s).
    };
    try {
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, {stream: true});
        const eol = /\r\n|\r|\n/g;
        let start = 0;
        let m;
        while ((m = eol.exec(buffer))) {
          if (m[0] === '\r' && m.index + 1 === buffer.length) break; // maybe the first half of \r\n
          onLine(buffer.slice(start, m.index));
          start = eol.lastIndex;
        }
        buffer = buffer.slice(start);
      }
    } finally {
      reader.cancel().catch(() => {});
    }
  }

  function onSse(D, name, data) {
    if (D.closed) return;
    if (name === 'error') {
      let body = {};
      try {
        body = JSON.parse(data) || {};
      } catch {
        body = {message: data};
      }
      const err = new ApiError(normCode(body.code) || 'INTERNAL', body.message || 'the event stream failed');
      if (err.unauthorized) {
        requireToken(true);
        return;
      }
      if (FATAL_CODES.has(err.code)) D.streamFatal = true;
      D.streamError = err;
      setStream(D, 'error', err);
      return;
    }
    if (name !== 'run' && name !== 'message') return;
    let ev;
    try {
      ev = JSON.parse(data);
    } catch {
      console.warn('assay admin: an event that is not JSON was skipped');
      return;
    }
    onEvent(D, ev);
  }

  /** The event stream's state next to the run's title (with the last error, if any). */
  function setStream(D, state, err) {
    const el = D.els.streamStatus;
    if (!el) return;
    el.dataset.stream = state;
    const text = {
      connecting: 'Connecting to events…',
      live: 'Live',
      reconnecting: 'Reconnecting…',
      finished: 'All events received',
      error: 'Events: ',
    }[state];
    el.replaceChildren(text, ...(err ? [' ', ...errorNodes(err)] : []));
  }

  // ---------------------------------------------------------------- run detail: layout

  function buildDetail(D, run) {
    const e = D.els;
    e.title = h('h2', {id: 'run-title', tabindex: '-1'}, run.label || `${kindLabel(run.kind)} run`);
    e.state = h('span', {id: 'run-state'});
    e.meta = h('span', {class: 'run-meta'});
    e.streamStatus = h('span', {id: 'stream-status', class: 'stream'});
    e.notice = h('p', {id: 'notice', class: 'notice', hidden: true});
    e.outcome = h('div', {id: 'outcome', class: 'outcome', role: 'status', hidden: true});
    e.audit = h('ol', {id: 'audit', class: 'audit'});
    e.auditNone = h('p', {class: 'muted'}, 'No control actions recorded yet.');
    e.events = h('ul', {id: 'events', class: 'events'});
    e.eventsMeta = h('p', {class: 'muted'}, 'No events yet.');
    e.root = h('section', {
      id: 'run', 'data-run-id': D.id, 'data-kind': run.kind || '', 'data-state': run.state || '',
      'aria-labelledby': 'run-title',
    },
    h('a', {id: 'back', class: 'back', href: '#/'}, '← All runs'),
    h('header', {class: 'run-head'}, e.title, h('p', {class: 'run-sub'}, e.state, ' ', e.meta, ' ', e.streamStatus)),
    e.notice,
    e.outcome,
    buildControls(D),
    kindView(D.kind) ? kindView(D.kind).build(D) : null,
    panel('Audit log', e.audit, e.auditNone),
    panel('Recent events', e.eventsMeta, e.events));
    els.detailView.replaceChildren(e.root);
  }

  function renderDetail(D) {
    const {run, els: e} = D;
    e.root.dataset.state = run.state || '';
    e.root.dataset.kind = run.kind || '';
    patch(e.state, run.state, () => badge(run.state));
    const tokens = tokensOf(run.usage);
    patch(e.meta, [run.kind, run.runId, run.createdAt, run.updatedAt, tokens], () => [
      kindLabel(run.kind), ' · ', h('code', run.runId || D.id), ' · started ', timeEl(run.createdAt),
      ' · updated ', timeEl(run.updatedAt), ' · ', h('span', {id: 'run-tokens'}, String(tokens)), ' tokens',
    ]);
    renderNotice(D);
    renderOutcome(D);
    updateControls(D);
    const view = kindView(D.kind);
    if (view) view.render(D);
    renderAudit(D);
    flushEventLog(D);
  }

  /** The panels of each pipeline kind: build once, render on every change. */
  function kindView(kind) {
    return {
      [REFINEMENT]: {build: buildRefinement, render: renderRefinement},
      PIPELINE_KIND_CHECKLIST_EVAL: {build: buildChecklistEval, render: renderChecklistEval},
      PIPELINE_KIND_GENERATE_CHECKLIST: {build: buildGenerate, render: renderGenerate},
      PIPELINE_KIND_DEBATE: {build: buildDebate, render: renderDebate},
      PIPELINE_KIND_SELF_REFINE: {build: buildSelfRefine, render: renderSelfRefine},
    }[kind] || null;
  }

  function renderNotice(D) {
    const {run, els: e} = D;
    let text = '';
    if (run.state === AWAITING) {
      const esc = D.escalation;
      text = 'Waiting for a human decision'
        + (esc ? `: ${esc.reason} (best score ${fmtScore(esc.bestScore)} at iteration ${num(esc.bestIteration)})` : '.')
        + ' Edit a section, accept the current content, mark it as reviewed, or resume.';
    } else if (run.state === PAUSED) {
      text = D.kind === REFINEMENT
        ? 'Paused. Edit a section, accept the current content, or resume.'
        : 'Paused. Resume or cancel the run.';
    }
    e.notice.textContent = text;
    e.notice.hidden = !text;
  }

  function renderOutcome(D) {
    const {run, els: e} = D;
    const finished = TERMINAL.has(run.state);
    e.outcome.hidden = !finished;
    const result = run.result || {};
    const tr = result.targetedRefinement;
    e.outcome.dataset.state = finished ? run.state : '';
    e.outcome.dataset.outcome = tr ? tr.outcome || '' : '';
    patch(e.outcome, finished ? [run.state, result] : null, () => {
      if (!finished) return [];
      const lines = [h('p', h('strong', 'Finished: '), badge(run.state))];
      if (tr) {
        lines.push(h('p', 'Outcome: ', h('strong', {class: 'outcome-name'}, enumLabel(tr.outcome, 'REFINEMENT_OUTCOME_')),
          ' ', h('code', {class: 'enum'}, tr.outcome || ''),
          ` · final score ${fmtScore(tr.finalScore)} after ${plural(num(tr.iterations), 'iteration')}`,
          ` · quality ${enumLabel(tr.quality, 'QUALITY_STATUS_')}`));
        if (tr.stopReason) lines.push(h('p', 'Stopped: ', tr.stopReason));
        if (tr.warning) lines.push(h('p', {class: 'warn-text'}, 'Warning: ', tr.warning));
      } else if (result.debate) {
        const d = result.debate;
        lines.push(h('p', `${num(d.problemsTotal)} problems, ${num(d.problemsFailed)} failed · accuracy ${fmtPct(d.accuracy)}`
          + (d.accuracyAll != null ? ` (graded) · ${fmtPct(d.accuracyAll)} over all problems, failed counted wrong` : '')));
      } else if (result.checklistEval) {
        const r = result.checklistEval;
        lines.push(h('p', `${plural((r.results || []).length, 'record')} · mean primary score ${fmtScore(r.aggregate && r.aggregate.meanPrimaryScore)}`));
      } else if (result.selfRefine) {
        lines.push(h('p', `Stopped: ${enumLabel(result.selfRefine.stopReason, 'SELF_REFINE_STOP_REASON_')}`));
      }
      if (result.error) lines.push(h('p', {class: 'error-text'}, 'Error: ', result.error));
      return lines;
    });
  }

  // ---------------------------------------------------------------- controls

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

  function buildControls(D) {
    const e = D.els;
    const isRefinement = D.kind === REFINEMENT;
    e.actor = h('input', {id: 'actor', type: 'text', autocomplete: 'off', spellcheck: 'false', maxlength: '200'});
    e.actor.value = loadActor();
    e.actor.addEventListener('change', () => saveActor(e.actor.value.trim()));
    e.reason = h('input', {
      id: 'reason', type: 'text', autocomplete: 'off', maxlength: '2000', placeholder: 'Why (written to the audit log)',
    });
    const button = (id, text, action, cls) => h('button', {
      type: 'button', id, class: cls, onclick: () => control(D, action),
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
    e.controlError = h('div', {id: 'control-error', class: 'error', role: 'alert'});
    e.controlStatus = h('p', {id: 'control-status', class: 'muted', role: 'status'});

    const children = [
      h('div', {class: 'fields'},
        h('label', {for: 'actor'}, 'Actor'), e.actor,
        h('label', {for: 'reason'}, 'Reason'), e.reason),
      h('div', {class: 'buttons', role: 'group', 'aria-label': 'Run actions'}, Object.values(e.btn)),
      h('p', {class: 'help'}, isRefinement
        ? 'Intervene pauses after the current task. Edit, accept or resume while paused or awaiting a human; mark as reviewed only when awaiting a human.'
        : 'Pause while running, resume while paused; cancel until the run finishes.'),
    ];
    if (isRefinement) {
      e.editSection = h('select', {id: 'edit-section'});
      e.editContent = h('textarea', {id: 'edit-content', rows: '7', spellcheck: 'true'});
      e.btn.edit = h('button', {
        type: 'button', id: 'btn-edit',
        onclick: () => control(D, 'editSection', {sectionId: e.editSection.value, content: e.editContent.value}),
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

  function updateControls(D) {
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

  async function control(D, action, payload = {}) {
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
      scheduleRefresh(D, 0);
    } catch (err) {
      if (app.view !== D || err.unauthorized) return;
      e.controlStatus.textContent = '';
      e.controlError.replaceChildren(...errorNodes(err));
    } finally {
      if (app.view === D) {
        D.busy = false;
        renderDetail(D);
      }
    }
  }

  // ---------------------------------------------------------------- targeted refinement

  /** The refinement as it stands: progress while running, the result once there is one. */
  function refinementView(D) {
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

  function buildRefinement(D) {
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

  function renderRefinement(D) {
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

  // ---------------------------------------------------------------- progress (checklist, debate, self-refine)

  function buildProgress(D, unit) {
    const e = D.els;
    e.recordsProgress = h('strong', {id: 'records-progress'}, '0/0');
    e.recordsBar = h('progress', {id: 'records-bar', max: '1', value: '0', 'aria-label': `${unit} done`});
    e.recordsFailed = h('strong', {id: 'records-failed'}, '0');
    e.stageProgress = h('p', {class: 'muted small'});
    return panel('Progress',
      h('p', `${unit} done `, e.recordsProgress, ' · failed ', e.recordsFailed), e.recordsBar, e.stageProgress);
  }

  function renderProgress(D, done, total, failed) {
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

  // ---------------------------------------------------------------- checklist evaluation / generation

  function buildChecklistEval(D) {
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

  function renderChecklistEval(D) {
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

  function buildGenerate(D) {
    D.els.checklists = h('div', {id: 'checklists'});
    return [buildProgress(D, 'Records'), panel('Checklist', D.els.checklists)];
  }

  function renderGenerate(D) {
    const {run, els: e} = D;
    const checklists = new Map(D.checklists);
    const result = run.result && run.result.checklist;
    if (result) checklists.set(result.id, result);
    const total = num(run.recordsTotal);
    renderProgress(D, result ? Math.max(total, num(run.recordsDone)) : num(run.recordsDone), total, 0);
    patch(e.checklists, [...checklists.values()], () => checklistNodes([...checklists.values()]));
  }

  // ---------------------------------------------------------------- debate

  function buildDebate(D) {
    const e = D.els;
    e.debateSummary = h('dl', {id: 'debate-summary', class: 'kv'});
    e.debate = h('div', {id: 'debate'});
    e.debateNone = h('p', {class: 'muted'}, 'No problem has finished a stage yet.');
    return [buildProgress(D, 'Problems'), panel('Summary', e.debateSummary), panel('Problems', e.debateNone, e.debate)];
  }

  function renderDebate(D) {
    const {run, els: e} = D;
    const res = run.result && run.result.debate;
    const problems = new Map(D.problems);
    for (const p of (res && res.problems) || []) {
      const key = p.id || `#${num(p.index) + 1}`;
      problems.set(key, {...(problems.get(key) || {stages: []}), id: key, index: num(p.index), done: p});
    }
    const list = [...problems.values()].sort((a, b) => a.index - b.index);
    const done = list.filter((p) => p.done);
    const failedCount = res ? num(res.problemsFailed) : done.filter((p) => p.done.error).length;
    renderProgress(D, Math.max(num(run.recordsDone), done.length), num(run.recordsTotal) || (res ? num(res.problemsTotal) : 0), failedCount);

    patch(e.debateSummary, [res || null, done.length, tokensOf(run.usage)], () => {
      if (res) {
        return kv([
          ['Problems', `${num(res.problemsTotal)} (${num(res.problemsFailed)} failed)`],
          ['Correct / graded', `${num(res.correct)}/${num(res.graded)}`],
          ['Accuracy', res.accuracy != null ? fmtPct(res.accuracy) : 'not graded'],
          ['Accuracy over all problems', res.accuracyAll != null
            ? `${fmtPct(res.accuracyAll)} (${num(res.correct)}/${num(res.graded) + num(res.failedWithReference)}, ${num(res.failedWithReference)} failed counted wrong)`
            : null],
          ['Consensus rate', fmtPct(res.consensusRate)],
          ['Changed rate', fmtPct(res.changedRate)],
          ['Tokens', `${num(res.tokens)} in ${plural(num(res.calls), 'call')}`],
          ['Single-model accuracy', res.singleModelAccuracy != null ? fmtPct(res.singleModelAccuracy) : null],
          ['Self-consistency accuracy', res.selfConsistencyAccuracy != null ? fmtPct(res.selfConsistencyAccuracy) : null],
          ['Baseline tokens', res.baselineUsage ? String(tokensOf(res.baselineUsage)) : null],
        ]);
      }
      const ok = done.filter((p) => !p.done.error).map((p) => p.done);
      const graded = ok.filter((p) => p.correct != null);
      const failedRef = done.filter((p) => p.done.error && p.done.reference).length;
      const share = (n) => (ok.length ? fmtPct(n / ok.length) : '—');
      return kv([
        ['Problems done', `${done.length} (so far)`],
        ['Correct / graded', `${graded.filter((p) => p.correct).length}/${graded.length}`],
        ['Correct / all with a reference', failedRef
          ? `${graded.filter((p) => p.correct).length}/${graded.length + failedRef} (${failedRef} failed counted wrong)` : null],
        ['Consensus rate', share(ok.filter((p) => p.consensus).length)],
        ['Changed rate', share(ok.filter((p) => p.answersChanged).length)],
        ['Tokens', String(tokensOf(run.usage))],
      ]);
    });

    e.debateNone.hidden = list.length > 0;
    list.forEach((p, i) => {
      let el = D.problemEls.get(p.id);
      if (!el) {
        el = h('article', {class: 'problem', 'data-problem-id': p.id});
        D.problemEls.set(p.id, el);
      }
      if (e.debate.children[i] !== el) e.debate.insertBefore(el, e.debate.children[i] || null);
      el.classList.toggle('done', Boolean(p.done));
      patch(el, [p.done, p.done && p.done.debate ? null : p.stages], () => problemNodes(p));
    });
  }

  function problemNodes(p) {
    const d = p.done;
    const debate = d && d.debate;
    const tags = [];
    if (!d) tags.push(tag('debating', 'running'));
    else if (d.error) tags.push(tag('failed', 'bad'));
    if (d && !d.error) {
      tags.push(d.correct == null ? tag('ungraded') : d.correct ? tag('correct', 'good') : tag('incorrect', 'bad'));
      tags.push(tag(d.consensus ? 'consensus' : 'no consensus'));
      if (d.decidedBy) tags.push(tag(`decided by ${enumLabel(d.decidedBy, 'DEBATE_DECISION_')}`));
    }
    const b = d && d.baselines;
    const correctText = (x) => (x == null ? '' : x ? ' (correct)' : ' (incorrect)');
    return [
      h('header', h('h4', `Problem ${p.id}`), h('span', {class: 'tags'}, tags)),
      h('dl', {class: 'kv'}, kv([
        ['Final answer', h('div', {class: ['final-answer', 'text', !d && 'pending']}, d ? d.finalAnswer || '—' : 'pending')],
        ['Reference', d && d.reference ? h('span', {class: 'text'}, d.reference) : null],
        ['Answers changed', d && !d.error ? yesNo(d.answersChanged) : null],
        ['Winner', debate && debate.winnerSolverId ? debate.winnerSolverId : null],
        ['Stopped early', debate && debate.stoppedEarly ? 'yes' : null],
        ['Tokens', debate && debate.usage ? String(tokensOf(debate.usage)) : null],
        ['Error', d && d.error ? h('span', {class: 'error-text'}, d.error) : null],
        ['Single model', b ? h('span', {class: 'text'}, `${b.singleModelAnswer || '—'}${correctText(b.singleModelCorrect)}`) : null],
        ['Self-consistency', b ? h('span', {class: 'text'},
          `${b.selfConsistencyAnswer || '—'}${correctText(b.selfConsistencyCorrect)} · ${num(b.votes)}/${num(b.samples)} votes`) : null],
      ])),
      d && d.selfRefined ? h('div', {class: 'hook'}, h('h5', 'Self-refine hook'), selfRefinedNode(d.selfRefined, `${p.id}/hook`)) : null,
      debateStages(p).map((st) => h('details', {
        class: 'stage', 'data-stage': st.stage || '', 'data-key': `${p.id}/${st.stage}/${num(st.round)}`,
      }, h('summary', stageLabel(st)), stageBody(st))),
    ];
  }

  /** Every stage's artifacts: from the finished debate when there is one, else from the stage events. */
  function debateStages(p) {
    const debate = p.done && p.done.debate;
    if (!debate) return p.stages;
    const stages = [{stage: 'solve', round: 0, solutions: debate.solutions || []}];
    const rounds = debate.rounds || [];
    for (const r of rounds) {
      stages.push({stage: 'review', round: r.round, reviews: r.reviews || []});
      stages.push({stage: 'refine', round: r.round, refined: r.refined || [], consensus: r.consensus});
    }
    if (!rounds.length && ((debate.reviews || []).length || (debate.refined || []).length)) {
      stages.push({stage: 'review', round: 1, reviews: debate.reviews || []});
      stages.push({stage: 'refine', round: 1, refined: debate.refined || []});
    }
    if (debate.judgment) stages.push({stage: 'judge', round: rounds.length, judgment: debate.judgment});
    return stages;
  }

  function stageLabel(st) {
    const name = {solve: 'Solutions', review: 'Reviews', refine: 'Refined solutions', judge: 'Judgment'}[st.stage] || st.stage;
    const round = (st.stage === 'review' || st.stage === 'refine') && st.round ? ` · round ${st.round}` : '';
    const usage = st.usage ? ` · ${tokensOf(st.usage)} tokens` : '';
    return `${name}${round}${st.consensus ? ' · consensus' : ''}${usage}`;
  }

  function stageBody(st) {
    switch (st.stage) {
      case 'solve': return (st.solutions || []).map(solutionNode);
      case 'review': return (st.reviews || []).map(reviewNode);
      case 'refine': return (st.refined || []).map(refinedNode);
      case 'judge': return st.judgment ? judgmentNode(st.judgment) : h('p', {class: 'muted'}, 'No judgment.');
      default: return h('p', {class: 'muted'}, 'Unknown stage.');
    }
  }

  function textList(title, items, cls) {
    return items && items.length
      ? [h('h6', title), h(cls === 'ol' ? 'ol' : 'ul', {class: 'texts'}, items.map((x) => h('li', {class: 'text'}, x)))]
      : null;
  }

  /** The model's raw replies behind an artifact (first call, then the retry), folded. */
  function rawReplies(replies) {
    if (!replies || !replies.length) return null;
    return h('details', {class: 'raw-replies'},
      h('summary', `Raw model ${replies.length > 1 ? `replies (${replies.length})` : 'reply'}`),
      replies.map((r, i) => h('div', {class: 'raw-reply'},
        h('p', {class: 'muted'}, `${i === 0 ? 'first call' : 'retry'} · finish ${r.finishReason || '?'} · ${num(r.bytes)} bytes`
          + (num(r.bytes) > new TextEncoder().encode(r.text || '').length ? ' (cut to the first 16 KiB)' : ''),
          r.unusableReason ? [' · ', h('span', {class: 'error-text'}, `unusable: ${r.unusableReason}`)] : null),
        h('pre', {class: 'text'}, r.text || ''))));
  }

  function solutionNode(sol) {
    return h('div', {class: 'artifact solution', 'data-solver-id': sol.solverId || ''},
      h('h5', sol.solverId || 'solver', h('span', {class: 'muted'}, ` · confidence ${fmtScore(sol.confidence)}`)),
      h('dl', {class: 'kv'}, kv([
        ['Approach', sol.approach ? h('span', {class: 'text'}, sol.approach) : null],
        ['Final answer', h('span', {class: 'text answer'}, sol.finalAnswer || '—')],
      ])),
      textList('Reasoning', sol.reasoningSteps, 'ol'),
      rawReplies(sol.rawReplies));
  }

  function reviewNode(r) {
    const errors = r.errors || [];
    return h('div', {class: 'artifact review'},
      h('h5', `${r.reviewerId || '?'} → ${r.targetSolverId || '?'}`),
      textList('Strengths', r.strengths),
      textList('Weaknesses', r.weaknesses),
      errors.length ? [h('h6', 'Errors'), h('ul', {class: 'texts'}, errors.map((x) => h('li', {class: 'text'},
        tag(enumLabel(x.severity, 'SEVERITY_'), 'sev'), ` ${x.errorType || ''}${x.location ? ` @ ${x.location}` : ''}: ${x.description || ''}`)))] : null,
      textList('Suggested changes', r.suggestedChanges),
      rawReplies(r.rawReplies));
  }

  function refinedNode(r) {
    const rejected = r.critiquesRejected || [];
    return h('div', {class: 'artifact refined', 'data-solver-id': r.solverId || ''},
      h('h5', r.solverId || 'solver', h('span', {class: 'muted'}, ` · confidence ${fmtScore(r.confidence)}`),
        r.changed ? [' ', tag('changed')] : null),
      h('dl', {class: 'kv'}, kv([
        ['Final answer', h('span', {class: 'text answer'}, r.finalAnswer || '—')],
        ['Refinement', r.refinementReasoning ? h('span', {class: 'text'}, r.refinementReasoning) : null],
        ['Improvement', r.improvementExplanation ? h('span', {class: 'text'}, r.improvementExplanation) : null],
      ])),
      textList('Critiques accepted', r.critiquesAccepted),
      rejected.length ? [h('h6', 'Critiques rejected'), h('ul', {class: 'texts'}, rejected.map((x) =>
        h('li', {class: 'text'}, x.critique || '', x.reason ? ` — ${x.reason}` : '')))] : null,
      textList('Reasoning', r.reasoningSteps, 'ol'),
      rawReplies(r.rawReplies));
  }

  function judgmentNode(j) {
    return h('div', {class: 'artifact judgment'}, h('dl', {class: 'kv'}, kv([
      ['Winner', j.winnerSolverId || '—'],
      ['Confidence', fmtScore(j.confidence)],
      ['Final answer', h('span', {class: 'text answer'}, j.finalAnswer || '—')],
      ['Reasoning', j.reasoning ? h('span', {class: 'text'}, j.reasoning) : null],
      ['Majority-vote fallback', j.majorityVoteFallback ? `yes${j.fallbackReason ? `: ${j.fallbackReason}` : ''}` : null],
    ])), rawReplies(j.rawReplies));
  }

  // ---------------------------------------------------------------- self-refine

  function buildSelfRefine(D) {
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

  function renderSelfRefine(D) {
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
  function selfRefinedNode(x, key) {
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

  // ---------------------------------------------------------------- audit log and event log

  function renderAudit(D) {
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

  function flushEventLog(D) {
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
      default: return 'unknown event';
    }
  }

  function refinementSummary(inner, x) {
    switch (inner) {
      case 'refinementStart': {
        const plan = x.plan || {};
        const tasks = (plan.batches || []).reduce((n, b) => n + (b.tasks || []).length, 0);
        const level = plan.consolidation ? enumLabel(plan.consolidation.agreement, 'AGREEMENT_LEVEL_') : '—';
        return `plan of ${plural(tasks, 'task')} in ${plural((plan.batches || []).length, 'batch', 'batches')}, ~${num(plan.estimatedTokens)} tokens, ${level} agreement${x.fullRegenerate ? ', full regeneration' : ''}`;
      }
      case 'batchStarted': return `batch ${num(x.batchIndex) + 1}/${num(x.batchesTotal)} started (${plural((x.taskIds || []).length, 'task')})`;
      case 'taskStarted': return `task ${(x.task && x.task.id) || ''} started: ${enumLabel(x.task && x.task.action, 'FIX_ACTION_')} of ${(x.task && x.task.sectionId) || ''}`;
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
      default: return 'refinement event';
    }
  }

  // ---------------------------------------------------------------- compare two runs

  const compare = {gen: 0};
  const COMPARE_METRICS = [
    ['COMPARE_METRIC_PRIMARY', 'primary score'], ['COMPARE_METRIC_PASS_RATE', 'pass rate'],
    ['COMPARE_METRIC_WEIGHTED', 'weighted score'], ['COMPARE_METRIC_NORMALIZED', 'normalized score'],
  ];
  const fmtDiff = (v) => (v == null || !Number.isFinite(Number(v)) ? '—' : `${Number(v) >= 0 ? '+' : ''}${Number(v).toFixed(4)}`);
  const fmtP = (v) => (v == null || !Number.isFinite(Number(v)) ? '—' : Number(v) < 0.0001 ? '< 0.0001' : Number(v).toFixed(4));
  /** 0.05 -> "95%". */
  const confLevel = (alpha) => `${Math.round((1 - (Number(alpha) || 0.05)) * 100)}%`;
  /** "COMPARE_METHOD_PAIRED_T" -> "paired_t" (evalconfidence's names). */
  const methodName = (m) => String(m || '').replace(/^COMPARE_METHOD_/, '').toLowerCase() || '—';

  function compareHash(baseline, candidate) {
    return `#/compare/${encodeURIComponent(baseline)}/${encodeURIComponent(candidate)}`;
  }

  async function openCompare(baseline, candidate, metric = 'COMPARE_METRIC_PRIMARY') {
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
        forest(r),
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
  function forest(r) {
    const W = 560, left = 110, right = 20, rowH = 28, top = 14;
    const rows = [{label: methodName(r.method), lo: Number(r.ciLow), hi: Number(r.ciHigh), cls: 'ci'}];
    if (r.bootstrap) rows.push({label: 'bootstrap', lo: Number(r.bootstrap.ciLow), hi: Number(r.bootstrap.ciHigh), cls: 'bootstrap'});
    const d = Number(r.diff);
    const values = [0, d, ...rows.flatMap((row) => [row.lo, row.hi])].filter(Number.isFinite);
    let min = Math.min(...values), max = Math.max(...values);
    if (max - min < 1e-9) { min -= 0.05; max += 0.05; }
    const pad = (max - min) * 0.1;
    min -= pad; max += pad;
    const x = (v) => left + ((v - min) / (max - min)) * (W - left - right);
    const H = top + rows.length * rowH + 22;
    const axisY = top + rows.length * rowH;
    return h('figure', {class: 'forest'},
      s('svg', {class: 'forest', id: 'forest', viewBox: `0 0 ${W} ${H}`, role: 'img',
        'aria-label': `difference ${fmtDiff(d)}, interval ${fmtDiff(r.ciLow)} to ${fmtDiff(r.ciHigh)}`},
      s('line', {class: 'axis', x1: left, x2: W - right, y1: axisY, y2: axisY}),
      s('line', {class: 'zero', x1: x(0), x2: x(0), y1: top - 8, y2: axisY}),
      s('text', {class: 'tick', x: x(0), y: axisY + 14, 'text-anchor': 'middle'}, '0'),
      // the ends of the data, unless they sit on the zero tick
      [min + pad, max - pad].filter((v) => Math.abs(x(v) - x(0)) > 48).map((v) =>
        s('text', {class: 'tick', x: x(v), y: axisY + 14, 'text-anchor': 'middle'}, fmtDiff(v))),
      rows.map((row, i) => {
        const y = top + i * rowH + rowH / 2;
        if (!Number.isFinite(row.lo) || !Number.isFinite(row.hi)) return null;
        return s('g', {class: `row ${row.cls}`},
          s('text', {x: 4, y: y + 4}, row.label),
          s('line', {class: ['interval', row.cls], x1: x(row.lo), x2: x(row.hi), y1: y, y2: y}),
          Number.isFinite(d) ? s('circle', {class: 'point', cx: x(d), cy: y, r: 5}) : null);
      })),
      h('figcaption', {class: 'muted'}, `${confLevel(r.alpha)} intervals on the difference; the dashed line is no difference.`));
  }

  // ---------------------------------------------------------------- start

  function wire() {
    for (const id of ['app', 'auth', 'token', 'status', 'list-view', 'detail-view', 'filter-state', 'filter-kind',
      'list-error', 'list-meta', 'runs', 'auth-error', 'btn-logout', 'compare-view', 'compare-form',
      'compare-baseline', 'compare-candidate', 'compare-form-error', 'eval-runs']) {
      els[id.replace(/-([a-z])/g, (_, c) => c.toUpperCase())] = document.getElementById(id);
    }
    els.logout = els.btnLogout;
    els.runsBody = els.runs.tBodies[0];

    for (const st of RUN_STATES) els.filterState.append(new Option(stateLabel(st), st));
    for (const k of KINDS) els.filterKind.append(new Option(kindLabel(k), k));
    els.filterState.addEventListener('change', loadRuns);
    els.filterKind.addEventListener('change', loadRuns);
    els.compareForm.addEventListener('submit', (ev) => {
      ev.preventDefault();
      const baseline = els.compareBaseline.value.trim();
      const candidate = els.compareCandidate.value.trim();
      if (!baseline || !candidate) {
        els.compareFormError.textContent = 'Give a baseline and a candidate run id.';
        return;
      }
      els.compareFormError.textContent = '';
      location.hash = compareHash(baseline, candidate);
    });

    els.runsBody.addEventListener('click', (ev) => {
      const tr = ev.target.closest('tr[data-run-id]');
      if (tr) openRowRun(tr);
    });
    els.runsBody.addEventListener('keydown', (ev) => {
      const tr = ev.target.closest('tr[data-run-id]');
      if (!tr || ev.target !== tr) return;
      if (ev.key === 'Enter' || ev.key === ' ') {
        ev.preventDefault();
        openRowRun(tr);
      } else if (ev.key === 'ArrowDown' || ev.key === 'ArrowUp') {
        const next = ev.key === 'ArrowDown' ? tr.nextElementSibling : tr.previousElementSibling;
        if (next && next.dataset.runId) {
          ev.preventDefault();
          next.focus();
        }
      }
    });

    els.auth.addEventListener('submit', (ev) => {
      ev.preventDefault();
      const token = els.token.value.trim();
      if (!token) {
        els.authError.textContent = 'Enter the token.';
        return;
      }
      try {
        sessionStorage.setItem(TOKEN_KEY, token);
      } catch {
        els.authError.textContent = 'This browser does not allow session storage; the token cannot be kept.';
        return;
      }
      els.token.value = '';
      els.authError.textContent = '';
      setStatus('Checking the token…');
      route();
    });
    els.logout.addEventListener('click', () => requireToken(false));

    window.addEventListener('hashchange', () => {
      if (!els.auth.hidden) return; // the token prompt stays until a call succeeds
      route();
    });
    document.addEventListener('visibilitychange', () => {
      if (!list.active) return;
      if (document.visibilityState === 'visible') loadRuns();
      else clearTimeout(list.timer);
    });
  }

  /** A token handed over in the URL fragment (`#token=...`): keep it for this tab, drop it from the URL. */
  function takeFragmentToken() {
    const m = /^#token=([^&]*)/.exec(location.hash);
    if (!m) return;
    let token = '';
    try {
      token = decodeURIComponent(m[1]).trim();
    } catch {
      token = '';
    }
    history.replaceState(null, '', `${location.pathname}${location.search}#/`);
    if (!token) return;
    try {
      sessionStorage.setItem(TOKEN_KEY, token);
    } catch { /* storage unavailable: the prompt asks for it */ }
  }

  async function boot() {
    takeFragmentToken();
    wire();
    let config = null;
    while (!config) {
      try {
        const res = await fetch('/api/config', {cache: 'no-store'});
        if (!res.ok) throw new Error(`HTTP ${res.status}`);
        config = await res.json();
      } catch (err) {
        setStatus(`Cannot load /api/config (${err.message}); retrying…`);
        await sleep(3000);
      }
    }
    setStatus('');
    app.authRequired = Boolean(config.authRequired);
    if (app.authRequired && !getToken()) requireToken(false);
    else route();
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', boot);
  else boot();
})();
