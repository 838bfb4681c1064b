/*
 * Assay admin page: DOM helpers shared by every view. Elements are built with createElement and
 * text nodes only (h, s), never by parsing HTML; patch() re-renders a container only when its data
 * changed and morphs the new nodes into the old ones, so focus and <details> state survive.
 */

import {stateLabel} from './format.js';

/** An element: h('p', {class: 'x', 'data-id': id}, 'text', node, [more]). Strings become text. */
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  return build(el, props, children);
}

/** The SVG counterpart of h(). */
export function s(tag, props, ...children) {
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
export function patch(el, data, render) {
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
export function panel(title, ...children) {
  const id = `panel-${++headingIds}`;
  return h('section', {class: 'panel', 'aria-labelledby': id}, h('h3', {id}, title), ...children);
}

/** <dt>/<dd> pairs; pairs whose value is null or '' are left out. */
export function kv(pairs) {
  const out = [];
  for (const [term, value] of pairs) {
    if (term == null || value == null || value === '') continue;
    out.push(h('dt', term), h('dd', value));
  }
  return out;
}

export function table(headers, rows, cls) {
  return h('div', {class: 'table-wrap'},
    h('table', {class: ['grid', cls]},
      h('thead', h('tr', headers.map((t) => h('th', {scope: 'col'}, t)))),
      h('tbody', rows)));
}

export function tag(text, cls) {
  return h('span', {class: ['tag', cls]}, text);
}

export function badge(state) {
  return h('span', {class: 'badge', 'data-state': state || ''}, stateLabel(state));
}

export function timeEl(ts, short) {
  if (!ts) return h('span', {class: 'time'}, '—');
  const d = new Date(ts);
  const text = Number.isNaN(d.getTime()) ? String(ts) : short ? d.toLocaleTimeString() : d.toLocaleString();
  return h('time', {datetime: ts, title: String(ts)}, text);
}
