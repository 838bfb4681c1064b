/*
 * Assay admin page: the state every view shares (the page's elements, the open view) and the
 * page's shell: the status line, revealing the app once the server takes the credentials, and the
 * token prompt (main.js owns it: it knows every view to stop).
 */

export const app = {authRequired: false, revealed: false, view: null};
export const els = {};

/** Show the app (and hide the token prompt) once the server takes the credentials. */
export function revealApp() {
  if (app.revealed) return;
  app.revealed = true;
  els.auth.hidden = true;
  els.authError.textContent = '';
  els.app.hidden = false;
  els.logout.hidden = !app.authRequired;
  setStatus('');
}

export function setStatus(text) {
  els.status.textContent = text;
}

let tokenRequired = () => {};

/**
 * Show only the token prompt: drop the token (it was refused or is missing) and every view. What
 * that takes is main.js's requireToken, handed over with onTokenRequired.
 */
export function requireToken(refused) {
  tokenRequired(refused);
}

/** Set what requireToken does (main.js, at start: it knows every view to stop). */
export function onTokenRequired(fn) {
  tokenRequired = fn;
}
