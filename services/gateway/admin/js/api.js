/*
 * Assay admin page: calls to the gateway's admin API (same origin), with the bearer token held for
 * this tab, and its errors as ApiError (the gRPC code, message and field violations).
 */

import {TOKEN_KEY} from './constants.js';
import {normCode} from './format.js';
import {revealApp, requireToken} from './page.js';
import {h} from './render.js';

export class ApiError extends Error {
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

export function getToken() {
  try {
    return sessionStorage.getItem(TOKEN_KEY) || '';
  } catch {
    return '';
  }
}

export function authHeaders(extra) {
  const headers = {...extra};
  const token = getToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  return headers;
}

/** POST /api/<method> with a proto3 JSON body; resolves to the response message. */
export async function api(method, body) {
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
export async function failure(res) {
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
export function errorNodes(err) {
  const violations = err.fieldViolations || [];
  return [
    h('strong', {class: 'code'}, err.code || 'ERROR'), ': ', h('span', {class: 'message'}, err.message || ''),
    violations.length ? h('ul', {class: 'violations'}, violations.map((v) =>
      h('li', h('code', v.field || '(request)'), ': ', v.description || ''))) : null,
  ];
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
