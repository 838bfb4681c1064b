/*
 * Assay admin page: differences with their intervals as a forest plot (SVG), shared by the compare
 * view (one run against another) and a run's responders (each against the baseline).
 */

import {h, s} from './render.js';

/** A signed difference with four decimals ('—' when there is none). */
export const fmtDiff = (v) => (v == null || !Number.isFinite(Number(v)) ? '—' : `${Number(v) >= 0 ? '+' : ''}${Number(v).toFixed(4)}`);

/**
 * A forest plot: a zero line, then one row per interval with its point.
 * rows: [{label, lo, hi, d, cls, data}] (d the point; data the row group's attributes);
 * opts: {id, left (label width), ariaLabel, caption, ends (tick the data's ends)}.
 */
export function forest(rows, {id, left = 110, ariaLabel, caption, ends = false}) {
  const W = 560, right = 20, rowH = 28, top = 14;
  const values = [0, ...rows.flatMap((r) => [r.lo, r.hi, r.d])].filter(Number.isFinite);
  let min = Math.min(...values), max = Math.max(...values);
  if (max - min < 1e-9) { min -= 0.05; max += 0.05; }
  const pad = (max - min) * 0.1;
  min -= pad; max += pad;
  const x = (v) => left + ((v - min) / (max - min)) * (W - left - right);
  const H = top + rows.length * rowH + 22;
  const axisY = top + rows.length * rowH;
  return h('figure', {class: 'forest'},
    s('svg', {class: 'forest', id, viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': ariaLabel},
    s('line', {class: 'axis', x1: left, x2: W - right, y1: axisY, y2: axisY}),
    s('line', {class: 'zero', x1: x(0), x2: x(0), y1: top - 8, y2: axisY}),
    s('text', {class: 'tick', x: x(0), y: axisY + 14, 'text-anchor': 'middle'}, '0'),
    // the ends of the data, unless they sit on the zero tick
    ends ? [min + pad, max - pad].filter((v) => Math.abs(x(v) - x(0)) > 48).map((v) =>
      s('text', {class: 'tick', x: x(v), y: axisY + 14, 'text-anchor': 'middle'}, fmtDiff(v))) : null,
    rows.map((row, i) => {
      const y = top + i * rowH + rowH / 2;
      if (!Number.isFinite(row.lo) || !Number.isFinite(row.hi)) return null;
      return s('g', {class: `row ${row.cls}`, ...(row.data || {})},
        s('text', {x: 4, y: y + 4}, row.label),
        s('line', {class: ['interval', row.cls], x1: x(row.lo), x2: x(row.hi), y1: y, y2: y}),
        Number.isFinite(row.d) ? s('circle', {class: 'point', cx: x(row.d), cy: y, r: 5}) : null);
    })),
    h('figcaption', {class: 'muted'}, caption));
}
