/*
 * Assay admin page, run detail: a debate, each problem's answer and every stage's artifacts
 * (solutions, reviews, refined solutions, judgment, the model's raw replies).
 */

import {enumLabel, fmtPct, fmtScore, num, plural, tokensOf, yesNo} from '../format.js';
import {h, kv, panel, patch, tag} from '../render.js';
import {buildProgress, renderProgress} from './progress.js';
import {selfRefinedNode} from './self_refine.js';

export function buildDebate(D) {
  const e = D.els;
  e.debateSummary = h('dl', {id: 'debate-summary', class: 'kv'});
  e.debate = h('div', {id: 'debate'});
  e.debateNone = h('p', {class: 'muted'}, 'No problem has finished a stage yet.');
  return [buildProgress(D, 'Problems'), panel('Summary', e.debateSummary), panel('Problems', e.debateNone, e.debate)];
}

export function renderDebate(D) {
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
