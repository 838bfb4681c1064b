/*
 * Assay admin page, run detail: the run's event stream (WatchRun as server-sent events over one
 * streamed fetch, since EventSource cannot send the bearer), reconnecting from the last sequence.
 */

import {FATAL_CODES, RECONNECT_MS} from '../constants.js';
import {normCode} from '../format.js';
import {ApiError, authHeaders, errorNodes, failure, sleep} from '../api.js';
import {requireToken} from '../page.js';

/**
 * Follow WatchRun: fetch + reader (EventSource cannot send the bearer), reconnecting on drops;
 * onEvent(D, ev) gets every RunEvent.
 */
export async function watch(D, onEvent) {
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
      await readSse(res.body, (name, data) => onSse(D, name, data, onEvent));
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

function onSse(D, name, data, onEvent) {
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
export function setStream(D, state, err) {
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
