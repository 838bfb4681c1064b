//! UnitTester: samples given without answers are first scored against every item (batch mode);
//! then for each item, the samples that scored YES on it (drawn down to `max_samples` with a
//! fixed seed) are rewritten by the model to fail the item, and each rewrite is scored by the
//! scorer stage (item mode, same backend and model); rate = rewrites scored NO / samples tested;
//! the item is kept iff rate >= threshold.
//!
//! Decisions (documented, checked against the original `unit_tester.py`):
//! - An item no sample passed cannot be tested: rate 0, removed, as the original does; the action
//!   says why.
//! - A rewrite the scorer could not answer (or an empty rewrite) is counted as not caught, and
//!   reported in `unchecked` (the original counts an ambiguous verdict as caught, which inflates
//!   the rate).
//! - The draw is a partial Fisher-Yates shuffle driven by splitmix64, seeded per item with the same
//!   seed (the original reseeds Python's `random` with 0 for every item); the drawn samples keep
//!   their request order.

use assay_domain::template::render;
use assay_domain::{
    Answer, Checklist, ChecklistItem, ModelSpec, ScoreRequest, ScoreTarget, ScorerConfig, ScorerSettings, ScoringMode,
    StageError, Usage,
};
use assay_llm::{ResolvedChat, ResponseFormat};
use futures::StreamExt;

use super::base::{ChecklistRefiners, REWRITE_TEMPLATE, chat_request};
use assay_domain::refiners::{
    ActionKind, DEFAULT_ENFORCEABILITY_THRESHOLD, DEFAULT_MAX_SAMPLES, DEFAULT_SEED, ItemEnforceability, RefinerAction,
    StepOutcome, UnitTestOptions, names,
};

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `k` distinct indices out of `0..n`, drawn deterministically from `seed`, ascending. All of
/// them when `k >= n`.
pub fn sample_indices(n: usize, k: usize, seed: u64) -> Vec<usize> {
    if k >= n {
        return (0..n).collect();
    }
    let mut state = seed;
    let mut pool: Vec<usize> = (0..n).collect();
    for i in 0..k {
        let span = (n - i) as u64;
        // Multiply-shift maps a 64-bit draw onto 0..span.
        let j = i + ((u128::from(splitmix64(&mut state)) * u128::from(span)) >> 64) as usize;
        pool.swap(i, j);
    }
    let mut picked = pool[..k].to_vec();
    picked.sort_unstable();
    picked
}

/// Max tokens of a rewrite unless configured: room for the sample plus slack.
fn rewrite_max_tokens(sample: &str) -> u32 {
    ((sample.len() / 3) as u32 + 256).clamp(512, 8192)
}

/// What one rewrite test found.
enum Check {
    /// The scorer answered NO on the rewrite.
    Caught,
    /// The scorer answered YES.
    Missed,
    /// No verdict (empty rewrite, failed call, unusable answer).
    Unchecked,
}

/// The spec the scorer gets: exactly the backend and model the rewrite used.
fn scorer_spec(chat: &ResolvedChat, requested: &ModelSpec) -> ModelSpec {
    ModelSpec {
        backend: Some(chat.backend.clone()),
        model: Some(chat.model_name()),
        temperature: Some(chat.settings.temperature.map_or(0.0, f64::from)),
        seed: chat.settings.seed,
        max_tokens: None,
        top_p: requested.top_p,
        cache_sampled: requested.cache_sampled,
        no_cache: requested.no_cache,
    }
}

/// The samples with their answers: a sample given without any is scored first against every
/// item (one batch-mode scorer call for all of them, same backend and model), as the original
/// scores raw samples; samples with answers are taken as they are.
async fn with_answers(
    scorer: &dyn assay_domain::Scorer,
    items: &[ChecklistItem],
    options: &UnitTestOptions,
    spec: &ModelSpec,
) -> Result<(Vec<assay_domain::refiners::Sample>, Usage), StageError> {
    let mut samples = options.samples.clone();
    let raw: Vec<usize> = (0..samples.len()).filter(|&i| samples[i].answers.is_empty()).collect();
    if raw.is_empty() {
        return Ok((samples, Usage::default()));
    }
    let mut checklist_items: Vec<ChecklistItem> = items.to_vec();
    for it in &mut checklist_items {
        it.metadata.clear();
    }
    let request = ScoreRequest {
        checklist: Checklist {
            id: "unit-test-samples".into(),
            items: checklist_items,
            input: options.input.clone(),
            ..Default::default()
        },
        targets: raw
            .iter()
            .map(|&i| ScoreTarget {
                id: samples[i].id.clone(),
                input: options.input.clone(),
                target: samples[i].text.clone(),
                ..Default::default()
            })
            .collect(),
        config: ScorerSettings::all(&ScorerConfig { mode: ScoringMode::Batch, ..Default::default() }),
        model: spec.clone(),
    };
    let outcome = scorer.score(request, &assay_domain::no_events).await?;
    for (&i, score) in raw.iter().zip(&outcome.scores) {
        samples[i].answers = score.item_scores.iter().filter_map(|s| Some((s.item_id.clone(), s.answer?))).collect();
    }
    Ok((samples, outcome.usage))
}

pub(super) async fn run(
    core: &ChecklistRefiners,
    items: Vec<ChecklistItem>,
    options: &UnitTestOptions,
) -> Result<StepOutcome, StageError> {
    let threshold = options.threshold.unwrap_or(DEFAULT_ENFORCEABILITY_THRESHOLD);
    let max_samples = options.max_samples.unwrap_or(DEFAULT_MAX_SAMPLES) as usize;
    let seed = options.seed.unwrap_or(DEFAULT_SEED);
    let chat = core.chat(&options.model, "model")?;
    let spec = scorer_spec(&chat, &options.model);
    let scorer = core.scorer()?;
    let (scored, mut usage) = with_answers(scorer.as_ref(), &items, options, &spec).await?;
    let samples = &scored;
    if !items.iter().any(|it| samples.iter().any(|s| s.answers.contains_key(&it.id))) {
        return Err(StageError::invalid(
            "samples",
            format!(
                "no sample has an answer for any of the {} items (answers are keyed by item id, e.g. {:?})",
                items.len(),
                items[0].id
            ),
        ));
    }
    let concurrency = core.effective_concurrency(options.concurrency);
    // One scorer call per rewrite, each a single model call, so `concurrency` bounds model calls.

    // Per item: the samples that passed it, drawn down to max_samples.
    let drawn: Vec<Vec<usize>> = items
        .iter()
        .map(|it| {
            let passing: Vec<usize> =
                (0..samples.len()).filter(|&s| samples[s].answers.get(&it.id) == Some(&Answer::Yes)).collect();
            sample_indices(passing.len(), max_samples, seed).into_iter().map(|k| passing[k]).collect()
        })
        .collect();
    let jobs: Vec<(usize, usize)> =
        drawn.iter().enumerate().flat_map(|(i, ss)| ss.iter().map(move |&s| (i, s))).collect();

    let (chat, spec, scorer, items_ref) = (&chat, &spec, &scorer, &items);
    let results: Vec<_> = futures::stream::iter(jobs)
        .map(|(i, s)| async move {
            let item = &items_ref[i];
            let sample = &samples[s];
            let mut usage = Usage::default();
            let prompt = render(
                REWRITE_TEMPLATE,
                &[("question", item.question.trim()), ("input", options.input.trim()), ("sample", sample.text.trim())],
            );
            let req = chat_request(chat, prompt, ResponseFormat::Text, rewrite_max_tokens(&sample.text));
            let rewrite = match chat.model.chat(req).await {
                Ok(r) => {
                    usage.add(&r.usage);
                    r.text.trim().to_string()
                }
                Err(e) if e.is_transient() => return Ok((i, Check::Unchecked, usage)),
                Err(e) => return Err(StageError::from(e)),
            };
            if rewrite.is_empty() {
                return Ok((i, Check::Unchecked, usage));
            }
            let mut one = item.clone();
            one.metadata.clear();
            let request = ScoreRequest {
                checklist: Checklist {
                    id: format!("unit-test-{}", item.id),
                    items: vec![one],
                    input: options.input.clone(),
                    ..Default::default()
                },
                targets: vec![ScoreTarget {
                    id: sample.id.clone(),
                    input: options.input.clone(),
                    target: rewrite,
                    ..Default::default()
                }],
                config: ScorerSettings::all(&ScorerConfig { mode: ScoringMode::Item, ..Default::default() }),
                model: spec.clone(),
            };
            let outcome = scorer.score(request, &assay_domain::no_events).await?;
            usage.add(&outcome.usage);
            let answer = outcome.scores.first().and_then(|s| s.item_scores.first()).and_then(|s| s.answer);
            let check = match answer {
                Some(Answer::No) => Check::Caught,
                Some(Answer::Yes) => Check::Missed,
                None => Check::Unchecked,
            };
            Ok((i, check, usage))
        })
        .buffered(concurrency)
        .collect()
        .await;

    let mut tallies: Vec<ItemEnforceability> = items
        .iter()
        .zip(&drawn)
        .map(|(it, d)| ItemEnforceability { item_id: it.id.clone(), samples: d.len() as u32, ..Default::default() })
        .collect();
    for r in results {
        let (i, check, u) = r?;
        usage.add(&u);
        match check {
            Check::Caught => tallies[i].correct_failures += 1,
            Check::Missed => {}
            Check::Unchecked => tallies[i].unchecked += 1,
        }
    }

    let mut out = Vec::new();
    let mut actions = Vec::with_capacity(items.len());
    for (it, t) in items.into_iter().zip(tallies.iter_mut()) {
        if t.samples == 0 {
            t.rate = 0.0;
            t.kept = false;
            actions.push(RefinerAction::new(
                names::UNIT_TESTER,
                &it.id,
                ActionKind::Removed,
                "untestable: no sample answered YES on this item, so there is nothing to rewrite (rate 0)",
            ));
            continue;
        }
        t.rate = f64::from(t.correct_failures) / f64::from(t.samples);
        t.kept = t.rate >= threshold;
        let unchecked =
            if t.unchecked > 0 { format!("; {} rewrite(s) got no verdict", t.unchecked) } else { String::new() };
        let reason = format!(
            "enforceability {:.2} ({} of {} failing rewrites caught{unchecked}) {} threshold {threshold}",
            t.rate,
            t.correct_failures,
            t.samples,
            if t.kept { ">=" } else { "<" }
        );
        actions.push(RefinerAction::new(
            names::UNIT_TESTER,
            &it.id,
            if t.kept { ActionKind::Kept } else { ActionKind::Removed },
            reason,
        ));
        if t.kept {
            let mut it = it;
            it.metadata.insert("enforceability_rate".into(), format!("{}", t.rate));
            it.metadata.insert("samples_tested".into(), t.samples.to_string());
            out.push(it);
        }
    }
    tracing::debug!(items = tallies.len(), kept = out.len(), "unit tested");
    Ok(StepOutcome { items: out, actions, usage, enforceability: tallies, ..Default::default() })
}
