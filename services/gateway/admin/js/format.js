/*
 * Assay admin page: formatting of numbers, enums and text (pure functions, no DOM).
 */

export const num = (v) => {
  const n = Number(v);
  return Number.isFinite(n) ? n : 0;
};
export const tokensOf = (usage) => (usage ? num(usage.promptTokens) + num(usage.completionTokens) : 0);
export const fmtScore = (v) => (v == null || v === '' || !Number.isFinite(Number(v)) ? '—' : Number(v).toFixed(3));
export const fmtPct = (v) => (v == null || !Number.isFinite(Number(v)) ? '—' : `${(Number(v) * 100).toFixed(1)}%`);
export const yesNo = (b) => (b ? 'yes' : 'no');
export const plural = (n, word, many = `${word}s`) => `${n} ${n === 1 ? word : many}`;
export const snake = (name) => name.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
export const clip = (text, n = 80) => {
  const t = String(text || '').replace(/\s+/g, ' ').trim();
  return t.length > n ? `${t.slice(0, n - 1)}…` : t;
};
export const firstNonEmpty = (...lists) => lists.find((l) => Array.isArray(l) && l.length) || [];

/** "RUN_STATE_AWAITING_HUMAN" -> "awaiting human". */
export function enumLabel(value, prefix) {
  if (value == null || value === '') return '—';
  let text = String(value);
  if (prefix && text.startsWith(prefix)) text = text.slice(prefix.length);
  if (text === 'UNSPECIFIED') return '—';
  return text.toLowerCase().replace(/_/g, ' ');
}
export const stateLabel = (v) => enumLabel(v, 'RUN_STATE_');
export const kindLabel = (v) => enumLabel(v, 'PIPELINE_KIND_');

/** gRPC codes arrive as "NOT_FOUND" or, from a broken stream, as "NotFound". */
export const normCode = (code) => (code ? String(code).replace(/([a-z])([A-Z])/g, '$1_$2').toUpperCase() : '');

/** 0.05 -> "95%". */
export const confLevel = (alpha) => `${Math.round((1 - (Number(alpha) || 0.05)) * 100)}%`;
