//! Conversions between wire messages and domain types. Proto -> domain collects every invalid field
//! into [`Violations`] with its full path; domain -> proto is infallible.

pub mod arbiter;
pub mod debate;
pub mod delta_judge;
pub mod document;
pub mod generator;
pub mod judge;
pub mod refiners;
pub mod runs;
pub mod self_refine;

use std::collections::BTreeMap;

use assay_domain as d;
use assay_domain::Violations;
use assay_domain::limits::*;

use crate::common::v1 as pb;

/// Decode an enum value, recording a violation for unknown numbers.
pub(crate) fn enum_value<E: TryFrom<i32>>(value: i32, field: &str, allowed: &str, v: &mut Violations) -> Option<E> {
    match E::try_from(value) {
        Ok(e) => Some(e),
        Err(_) => {
            v.push(field, format!("unknown enum value {value} (allowed: {allowed})"));
            None
        }
    }
}

pub fn model_spec(p: Option<pb::ModelSpec>, field: &str, v: &mut Violations) -> d::ModelSpec {
    let Some(pb::ModelSpec { backend, model, temperature, seed, max_tokens, top_p, cache_sampled, no_cache }) = p
    else {
        return d::ModelSpec::default();
    };
    if temperature.is_some_and(|t| !(0.0..=2.0).contains(&t)) {
        v.push(format!("{field}.temperature"), "must be between 0 and 2");
    }
    if top_p.is_some_and(|t| !(0.0..=1.0).contains(&t)) {
        v.push(format!("{field}.top_p"), "must be between 0 and 1");
    }
    if max_tokens == Some(0) {
        v.push(format!("{field}.max_tokens"), "must be at least 1 when set");
    }
    d::ModelSpec {
        backend: Some(backend).filter(|s| !s.is_empty()),
        model: Some(model).filter(|s| !s.is_empty()),
        temperature,
        seed,
        max_tokens,
        top_p,
        cache_sampled,
        no_cache,
    }
}

pub fn model_spec_to(s: &d::ModelSpec) -> pb::ModelSpec {
    pb::ModelSpec {
        backend: s.backend.clone().unwrap_or_default(),
        model: s.model.clone().unwrap_or_default(),
        temperature: s.temperature,
        seed: s.seed,
        max_tokens: s.max_tokens,
        top_p: s.top_p,
        cache_sampled: s.cache_sampled,
        no_cache: s.no_cache,
    }
}

pub(crate) fn text_limit(text: &str, field: &str, max: usize, v: &mut Violations) {
    if text.len() > max {
        v.push(field, format!("is {} bytes; the limit is {max} bytes", text.len()));
    }
}

/// Checklist from the wire. Empty item ids become `"1".."n"`; duplicate ids are an error.
pub fn checklist(p: Option<pb::Checklist>, field: &str, v: &mut Violations) -> d::Checklist {
    let Some(pb::Checklist {
        id,
        items,
        source_method,
        generation_level,
        input,
        corpus_description,
        created_at,
        metadata,
    }) = p
    else {
        v.push(field, "is required");
        return d::Checklist::default();
    };
    if items.is_empty() {
        v.push(format!("{field}.items"), "must not be empty");
    }
    if items.len() > MAX_CHECKLIST_ITEMS {
        v.push(format!("{field}.items"), format!("has {} items; the limit is {MAX_CHECKLIST_ITEMS}", items.len()));
    }
    text_limit(&id, &format!("{field}.id"), MAX_ID_BYTES, v);
    let level = enum_value::<pb::GenerationLevel>(generation_level, &format!("{field}.generation_level"), "0-2", v);
    let mut seen = std::collections::HashSet::new();
    let items = items
        .into_iter()
        .enumerate()
        .map(|(i, it)| {
            let f = format!("{field}.items[{i}]");
            let mut item = checklist_item(it, &f, v);
            if item.id.is_empty() {
                item.id = (i + 1).to_string();
            }
            if !seen.insert(item.id.clone()) {
                v.push(format!("{f}.id"), format!("duplicate id {:?}", item.id));
            }
            item
        })
        .collect();
    text_limit(&input, &format!("{field}.input"), MAX_TEXT_BYTES, v);
    d::Checklist {
        id,
        items,
        source_method,
        generation_level: match level {
            Some(pb::GenerationLevel::Corpus) => d::GenerationLevel::Corpus,
            Some(pb::GenerationLevel::Instance | pb::GenerationLevel::Unspecified) | None => {
                d::GenerationLevel::Instance
            }
        },
        input,
        corpus_description,
        created_at: created_at.map(|t| t.seconds),
        metadata: metadata.into_iter().collect(),
    }
}

pub fn checklist_item(p: pb::ChecklistItem, field: &str, v: &mut Violations) -> d::ChecklistItem {
    let pb::ChecklistItem { id, question, weight, category, metadata, merged_from, source_indices } = p;
    if question.trim().is_empty() {
        v.push(format!("{field}.question"), "must not be empty");
    }
    text_limit(&question, &format!("{field}.question"), MAX_QUESTION_BYTES, v);
    text_limit(&id, &format!("{field}.id"), MAX_ID_BYTES, v);
    text_limit(&category, &format!("{field}.category"), MAX_ID_BYTES, v);
    let weight = weight.unwrap_or(d::DEFAULT_WEIGHT);
    if !(0.0..=100.0).contains(&weight) || weight.is_nan() {
        v.push(format!("{field}.weight"), "must be between 0 and 100");
    }
    d::ChecklistItem {
        id,
        question,
        weight,
        category: Some(category).filter(|c| !c.is_empty()),
        metadata: metadata.into_iter().collect::<BTreeMap<_, _>>(),
        merged_from,
        source_indices,
    }
}

pub fn checklist_to(c: &d::Checklist) -> pb::Checklist {
    pb::Checklist {
        id: c.id.clone(),
        items: c.items.iter().map(checklist_item_to).collect(),
        source_method: c.source_method.clone(),
        generation_level: match c.generation_level {
            d::GenerationLevel::Instance => pb::GenerationLevel::Instance,
            d::GenerationLevel::Corpus => pb::GenerationLevel::Corpus,
        } as i32,
        input: c.input.clone(),
        corpus_description: c.corpus_description.clone(),
        created_at: c.created_at.map(|s| prost_types::Timestamp { seconds: s, nanos: 0 }),
        metadata: c.metadata.clone().into_iter().collect(),
    }
}

pub fn checklist_item_to(i: &d::ChecklistItem) -> pb::ChecklistItem {
    pb::ChecklistItem {
        id: i.id.clone(),
        question: i.question.clone(),
        weight: Some(i.weight),
        category: i.category.clone().unwrap_or_default(),
        metadata: i.metadata.clone().into_iter().collect(),
        merged_from: i.merged_from.clone(),
        source_indices: i.source_indices.clone(),
    }
}

/// Scorer settings from the wire: unset fields stay unset (the preset's defaults fill them).
pub fn scorer_config(p: Option<pb::ScorerConfig>, field: &str, v: &mut Violations) -> d::ScorerSettings {
    let Some(pb::ScorerConfig {
        mode,
        primary_metric,
        capture_reasoning,
        use_logprobs,
        prompt_template,
        concurrency,
        prompt,
        samples,
        sample_models,
    }) = p
    else {
        return d::ScorerSettings::default();
    };
    let mode = enum_value::<pb::ScoringMode>(mode, &format!("{field}.mode"), "0 unspecified, 1 batch, 2 item", v);
    let metric = enum_value::<pb::PrimaryMetric>(
        primary_metric,
        &format!("{field}.primary_metric"),
        "0 unspecified, 1 pass, 2 weighted, 3 normalized",
        v,
    );
    let prompt = enum_value::<pb::ScoringPrompt>(
        prompt,
        &format!("{field}.prompt"),
        "0 unspecified, 1 default, 2 rlcf, 3 rocketeval",
        v,
    );
    text_limit(&prompt_template, &format!("{field}.prompt_template"), MAX_TEMPLATE_BYTES, v);
    if concurrency > 256 {
        v.push(format!("{field}.concurrency"), format!("is {concurrency}; the limit is 256"));
    }
    if let Some(n) = samples.filter(|n| !(1..=d::MAX_JUDGE_SAMPLES).contains(n)) {
        v.push(format!("{field}.samples"), format!("is {n}; must be 1 to {}", d::MAX_JUDGE_SAMPLES));
    }
    d::check_sample_models(&sample_models, field, v);
    d::ScorerSettings {
        mode: match mode {
            Some(pb::ScoringMode::Item) => Some(d::ScoringMode::Item),
            Some(pb::ScoringMode::Batch) => Some(d::ScoringMode::Batch),
            Some(pb::ScoringMode::Unspecified) | None => None,
        },
        primary_metric: match metric {
            Some(pb::PrimaryMetric::Unspecified) | None => None,
            Some(m) => Some(primary_metric_from(m)),
        },
        capture_reasoning,
        use_logprobs,
        prompt: match prompt {
            Some(pb::ScoringPrompt::Default) => Some(d::ScoringPrompt::Default),
            Some(pb::ScoringPrompt::Rlcf) => Some(d::ScoringPrompt::Rlcf),
            Some(pb::ScoringPrompt::Rocketeval) => Some(d::ScoringPrompt::RocketEval),
            Some(pb::ScoringPrompt::Unspecified) | None => None,
        },
        prompt_template: Some(prompt_template).filter(|t| !t.is_empty()),
        concurrency: Some(concurrency).filter(|c| *c > 0),
        samples,
        sample_models,
    }
}

fn primary_metric_from(m: pb::PrimaryMetric) -> d::PrimaryMetric {
    match m {
        pb::PrimaryMetric::Weighted => d::PrimaryMetric::Weighted,
        pb::PrimaryMetric::Normalized => d::PrimaryMetric::Normalized,
        pb::PrimaryMetric::Pass | pb::PrimaryMetric::Unspecified => d::PrimaryMetric::Pass,
    }
}

pub fn primary_metric_to(m: d::PrimaryMetric) -> pb::PrimaryMetric {
    match m {
        d::PrimaryMetric::Pass => pb::PrimaryMetric::Pass,
        d::PrimaryMetric::Weighted => pb::PrimaryMetric::Weighted,
        d::PrimaryMetric::Normalized => pb::PrimaryMetric::Normalized,
    }
}

/// A whole configuration on the wire (every field set).
pub fn scorer_config_to(c: &d::ScorerConfig) -> pb::ScorerConfig {
    scorer_settings_to(&d::ScorerSettings::all(c))
}

/// Settings on the wire; unset fields stay unset.
pub fn scorer_settings_to(c: &d::ScorerSettings) -> pb::ScorerConfig {
    pb::ScorerConfig {
        mode: match c.mode {
            None => pb::ScoringMode::Unspecified,
            Some(d::ScoringMode::Batch) => pb::ScoringMode::Batch,
            Some(d::ScoringMode::Item) => pb::ScoringMode::Item,
        } as i32,
        primary_metric: c.primary_metric.map_or(pb::PrimaryMetric::Unspecified, primary_metric_to) as i32,
        capture_reasoning: c.capture_reasoning,
        use_logprobs: c.use_logprobs,
        prompt_template: c.prompt_template.clone().unwrap_or_default(),
        concurrency: c.concurrency.unwrap_or(0),
        prompt: match c.prompt {
            None => pb::ScoringPrompt::Unspecified,
            Some(d::ScoringPrompt::Default) => pb::ScoringPrompt::Default,
            Some(d::ScoringPrompt::Rlcf) => pb::ScoringPrompt::Rlcf,
            Some(d::ScoringPrompt::RocketEval) => pb::ScoringPrompt::Rocketeval,
        } as i32,
        samples: c.samples,
        sample_models: c.sample_models.clone(),
    }
}

pub fn usage_to(u: &d::Usage) -> pb::Usage {
    pb::Usage {
        calls: u.calls,
        prompt_tokens: u.prompt_tokens,
        completion_tokens: u.completion_tokens,
        cache_hits: u.cache_hits,
        retries: u.retries,
        schema_fallbacks: u.schema_fallbacks,
        cost_estimate_usd: u.cost_usd,
        cached_prompt_tokens: u.cached_prompt_tokens,
        cost_usd: u.cost(),
        unpriced_calls: u.unpriced_calls,
        cost_usd_by_backend: u.cost_by_backend.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        abandoned_calls: u.abandoned_calls,
        abandoned_tokens: u.abandoned_tokens,
        abandoned_cost_usd: u.abandoned_cost_usd,
        hedged_calls: u.hedged_calls,
        schema_violations: u.schema_violations,
    }
}

pub fn usage_from(p: Option<pb::Usage>) -> d::Usage {
    let p = p.unwrap_or_default();
    d::Usage {
        calls: p.calls,
        prompt_tokens: p.prompt_tokens,
        completion_tokens: p.completion_tokens,
        cache_hits: p.cache_hits,
        retries: p.retries,
        schema_fallbacks: p.schema_fallbacks,
        cached_prompt_tokens: p.cached_prompt_tokens,
        cost_usd: p.cost_usd.unwrap_or(p.cost_estimate_usd),
        // A sender that knows no prices sets neither field: its calls are unpriced.
        unpriced_calls: if p.cost_usd.is_none() && p.unpriced_calls == 0 { p.calls } else { p.unpriced_calls },
        cost_by_backend: p.cost_usd_by_backend.into_iter().filter(|(_, v)| v.is_finite() && *v > 0.0).collect(),
        abandoned_calls: p.abandoned_calls,
        abandoned_tokens: p.abandoned_tokens,
        abandoned_cost_usd: if p.abandoned_cost_usd.is_finite() { p.abandoned_cost_usd.max(0.0) } else { 0.0 },
        hedged_calls: p.hedged_calls,
        schema_violations: p.schema_violations,
    }
}

pub fn model_record_to(r: &d::ModelRecord) -> pb::ModelRecord {
    pb::ModelRecord {
        phase: r.phase.clone(),
        backend: r.backend.clone(),
        model: r.model.clone(),
        temperature: r.temperature,
        seed: r.seed,
        max_tokens: r.max_tokens,
        prompt_template_sha256: r.prompt_template_sha256.clone(),
        logprobs_requested: r.logprobs_requested,
        structured_output: r.structured_output.clone(),
        prompt_cut_chars: r.prompt_cut_chars,
    }
}

pub fn model_record_from(p: Option<pb::ModelRecord>) -> d::ModelRecord {
    let p = p.unwrap_or_default();
    d::ModelRecord {
        phase: p.phase,
        backend: p.backend,
        model: p.model,
        temperature: p.temperature,
        seed: p.seed,
        max_tokens: p.max_tokens,
        prompt_template_sha256: p.prompt_template_sha256,
        logprobs_requested: p.logprobs_requested,
        structured_output: p.structured_output,
        prompt_cut_chars: p.prompt_cut_chars,
    }
}

fn level_to(l: d::ConfidenceLevel) -> pb::ConfidenceLevel {
    match l {
        d::ConfidenceLevel::No10 => pb::ConfidenceLevel::No10,
        d::ConfidenceLevel::No30 => pb::ConfidenceLevel::No30,
        d::ConfidenceLevel::Unsure => pb::ConfidenceLevel::Unsure,
        d::ConfidenceLevel::Yes70 => pb::ConfidenceLevel::Yes70,
        d::ConfidenceLevel::Yes90 => pb::ConfidenceLevel::Yes90,
    }
}

fn level_from(l: i32) -> Option<d::ConfidenceLevel> {
    match pb::ConfidenceLevel::try_from(l).ok()? {
        pb::ConfidenceLevel::No10 => Some(d::ConfidenceLevel::No10),
        pb::ConfidenceLevel::No30 => Some(d::ConfidenceLevel::No30),
        pb::ConfidenceLevel::Unsure => Some(d::ConfidenceLevel::Unsure),
        pb::ConfidenceLevel::Yes70 => Some(d::ConfidenceLevel::Yes70),
        pb::ConfidenceLevel::Yes90 => Some(d::ConfidenceLevel::Yes90),
        pb::ConfidenceLevel::Unspecified => None,
    }
}

fn answer_to(a: Option<d::Answer>) -> i32 {
    let a = match a {
        Some(d::Answer::Yes) => pb::Answer::Yes,
        Some(d::Answer::No) => pb::Answer::No,
        None => pb::Answer::Unspecified,
    };
    a as i32
}

fn answer_from(a: i32) -> Option<d::Answer> {
    match pb::Answer::try_from(a) {
        Ok(pb::Answer::Yes) => Some(d::Answer::Yes),
        Ok(pb::Answer::No) => Some(d::Answer::No),
        Ok(pb::Answer::Unspecified) | Err(_) => None,
    }
}

pub fn item_score_to(s: &d::ItemScore) -> pb::ItemScore {
    pb::ItemScore {
        item_id: s.item_id.clone(),
        answer: answer_to(s.answer),
        confidence: s.confidence,
        confidence_level: s.confidence_level.map_or(pb::ConfidenceLevel::Unspecified, level_to) as i32,
        reasoning: s.reasoning.clone(),
        status: match s.status {
            d::ItemStatus::Answered => pb::ItemStatus::Answered,
            d::ItemStatus::Unanswered => pb::ItemStatus::Unanswered,
            d::ItemStatus::Unparseable => pb::ItemStatus::Unparseable,
            d::ItemStatus::Failed => pb::ItemStatus::Failed,
        } as i32,
        error: s.error.clone(),
        sample_answers: s.sample_answers.iter().map(|a| answer_to(*a)).collect(),
        yes_share: s.yes_share,
        flaky: s.flaky,
        abstentions: s.abstentions,
    }
}

pub fn item_score_from(p: pb::ItemScore) -> d::ItemScore {
    let pb::ItemScore {
        item_id,
        answer,
        confidence,
        confidence_level,
        reasoning,
        status,
        error,
        sample_answers,
        yes_share,
        flaky,
        abstentions,
    } = p;
    d::ItemScore {
        item_id,
        answer: answer_from(answer),
        confidence,
        confidence_level: level_from(confidence_level),
        reasoning,
        status: match pb::ItemStatus::try_from(status) {
            Ok(pb::ItemStatus::Answered) => d::ItemStatus::Answered,
            Ok(pb::ItemStatus::Unanswered) => d::ItemStatus::Unanswered,
            Ok(pb::ItemStatus::Unparseable) => d::ItemStatus::Unparseable,
            Ok(pb::ItemStatus::Failed | pb::ItemStatus::Unspecified) | Err(_) => d::ItemStatus::Failed,
        },
        error,
        sample_answers: sample_answers.into_iter().map(answer_from).collect(),
        yes_share,
        flaky,
        abstentions,
    }
}

pub fn score_to(s: &d::Score) -> pb::Score {
    pb::Score {
        checklist_id: s.checklist_id.clone(),
        target_id: s.target_id.clone(),
        item_scores: s.item_scores.iter().map(item_score_to).collect(),
        pass_rate: s.pass_rate,
        weighted_score: s.weighted_score,
        normalized_score: s.normalized_score,
        scaled_score_1_5: s.scaled_score_1_5,
        primary_metric: primary_metric_to(s.primary_metric) as i32,
        primary_score: s.primary_score,
        answered_count: s.answered_count,
        unanswered_count: s.unanswered_count,
        logprobs_unavailable: s.logprobs_unavailable,
        schema_fallback: s.schema_fallback,
        sample_primary_scores: s.sample_primary_scores.clone(),
        sample_spread: s.sample_spread,
        abstentions: s.abstentions,
        off_answer_items: s.off_answer_items,
    }
}

pub fn score_from(p: pb::Score) -> d::Score {
    d::Score {
        checklist_id: p.checklist_id,
        target_id: p.target_id,
        item_scores: p.item_scores.into_iter().map(item_score_from).collect(),
        pass_rate: p.pass_rate,
        weighted_score: p.weighted_score,
        normalized_score: p.normalized_score,
        scaled_score_1_5: p.scaled_score_1_5,
        primary_metric: pb::PrimaryMetric::try_from(p.primary_metric).map(primary_metric_from).unwrap_or_default(),
        primary_score: p.primary_score,
        answered_count: p.answered_count,
        unanswered_count: p.unanswered_count,
        logprobs_unavailable: p.logprobs_unavailable,
        schema_fallback: p.schema_fallback,
        sample_primary_scores: p.sample_primary_scores,
        sample_spread: p.sample_spread,
        abstentions: p.abstentions,
        off_answer_items: p.off_answer_items,
    }
}

pub fn aggregate_to(a: &d::AggregateScores) -> pb::AggregateScores {
    pb::AggregateScores {
        targets: a.targets,
        mean_primary_score: a.mean_primary_score,
        macro_pass_rate: a.macro_pass_rate,
        micro_pass_rate: a.micro_pass_rate,
        category_pass_rates: a
            .category_pass_rates
            .iter()
            .map(|c| pb::CategoryPassRate { category: c.category.clone(), pass_rate: c.pass_rate, items: c.items })
            .collect(),
        unanswered_items: a.unanswered_items,
        uncertainty: a.uncertainty.as_ref().map(uncertainty_to),
        unscored_targets: a.unscored_targets,
        off_answer_items: a.off_answer_items,
    }
}

pub fn uncertainty_to(u: &d::ScoreUncertainty) -> pb::ScoreUncertainty {
    pb::ScoreUncertainty {
        mean: u.mean,
        observations: u.observations,
        clusters: u.clusters,
        alpha: u.alpha,
        se_naive: u.se_naive,
        ci_naive_low: u.ci_naive.0,
        ci_naive_high: u.ci_naive.1,
        se_clustered: u.se_clustered,
        ci_clustered_low: u.ci_clustered.map(|c| c.0),
        ci_clustered_high: u.ci_clustered.map(|c| c.1),
        inflation: u.inflation,
        se: u.se,
        ci_low: u.ci.0,
        ci_high: u.ci.1,
    }
}

pub fn uncertainty_from(p: pb::ScoreUncertainty) -> d::ScoreUncertainty {
    let pb::ScoreUncertainty {
        mean,
        observations,
        clusters,
        alpha,
        se_naive,
        ci_naive_low,
        ci_naive_high,
        se_clustered,
        ci_clustered_low,
        ci_clustered_high,
        inflation,
        se,
        ci_low,
        ci_high,
    } = p;
    d::ScoreUncertainty {
        mean,
        observations,
        clusters,
        alpha,
        se_naive,
        ci_naive: (ci_naive_low, ci_naive_high),
        se_clustered,
        ci_clustered: ci_clustered_low.zip(ci_clustered_high),
        inflation,
        se,
        ci: (ci_low, ci_high),
    }
}

pub fn aggregate_from(p: Option<pb::AggregateScores>) -> d::AggregateScores {
    let p = p.unwrap_or_default();
    d::AggregateScores {
        targets: p.targets,
        mean_primary_score: p.mean_primary_score,
        macro_pass_rate: p.macro_pass_rate,
        micro_pass_rate: p.micro_pass_rate,
        category_pass_rates: p
            .category_pass_rates
            .into_iter()
            .map(|c| d::CategoryPassRate { category: c.category, pass_rate: c.pass_rate, items: c.items })
            .collect(),
        unanswered_items: p.unanswered_items,
        uncertainty: p.uncertainty.map(uncertainty_from),
        unscored_targets: p.unscored_targets,
        off_answer_items: p.off_answer_items,
    }
}

/// Score request from the wire, validated (field names are relative to `prefix`).
pub fn score_request(p: crate::scorer::v1::ScoreRequest, prefix: &str) -> Result<d::ScoreRequest, d::StageError> {
    let crate::scorer::v1::ScoreRequest { checklist: cl, targets, config, model } = p;
    let mut v = Violations::new();
    let join = |f: &str| if prefix.is_empty() { f.to_string() } else { format!("{prefix}.{f}") };
    let checklist = checklist(cl, &join("checklist"), &mut v);
    if targets.is_empty() {
        v.push(join("targets"), "must not be empty");
    }
    if targets.len() > MAX_TARGETS {
        v.push(join("targets"), format!("has {} targets; the limit is {MAX_TARGETS}", targets.len()));
    }
    let targets = targets
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            let crate::scorer::v1::ScoreTarget { id, input, target, reference, history } = t;
            let f = join(&format!("targets[{i}]"));
            if target.trim().is_empty() {
                v.push(format!("{f}.target"), "must not be empty");
            }
            for (name, text) in
                [("input", &input), ("target", &target), ("reference", &reference), ("history", &history)]
            {
                text_limit(text, &format!("{f}.{name}"), MAX_TEXT_BYTES, &mut v);
            }
            d::ScoreTarget { id: if id.is_empty() { i.to_string() } else { id }, input, target, reference, history }
        })
        .collect();
    let config = scorer_config(config, &join("config"), &mut v);
    let model = model_spec(model, &join("model"), &mut v);
    v.into_result()?;
    Ok(d::ScoreRequest { checklist, targets, config, model })
}

pub fn score_request_to(r: &d::ScoreRequest) -> crate::scorer::v1::ScoreRequest {
    crate::scorer::v1::ScoreRequest {
        checklist: Some(checklist_to(&r.checklist)),
        targets: r
            .targets
            .iter()
            .map(|t| crate::scorer::v1::ScoreTarget {
                id: t.id.clone(),
                input: t.input.clone(),
                target: t.target.clone(),
                reference: t.reference.clone(),
                history: t.history.clone(),
            })
            .collect(),
        config: Some(scorer_settings_to(&r.config)),
        model: Some(model_spec_to(&r.model)),
    }
}

pub fn score_response_to(o: &d::ScoreOutcome) -> crate::scorer::v1::ScoreResponse {
    crate::scorer::v1::ScoreResponse {
        scores: o.scores.iter().map(score_to).collect(),
        aggregate: Some(aggregate_to(&o.aggregate)),
        usage: Some(usage_to(&o.usage)),
        model: Some(model_record_to(&o.model)),
    }
}

pub fn score_response_from(p: crate::scorer::v1::ScoreResponse) -> d::ScoreOutcome {
    d::ScoreOutcome {
        scores: p.scores.into_iter().map(score_from).collect(),
        aggregate: aggregate_from(p.aggregate),
        usage: usage_from(p.usage),
        model: model_record_from(p.model),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_enum_values_name_the_field() {
        let mut v = Violations::new();
        let _ = scorer_config(Some(pb::ScorerConfig { mode: 9, ..Default::default() }), "config", &mut v);
        let err = v.into_result().unwrap_err();
        assert!(err.to_string().contains("config.mode"), "{err}");
    }

    #[test]
    fn empty_and_oversized_inputs_are_rejected_with_limits() {
        let req = crate::scorer::v1::ScoreRequest {
            checklist: Some(pb::Checklist { items: vec![], ..Default::default() }),
            targets: vec![crate::scorer::v1::ScoreTarget {
                target: "x".repeat(MAX_TEXT_BYTES + 1),
                ..Default::default()
            }],
            ..Default::default()
        };
        let err = score_request(req, "").unwrap_err();
        let s = err.to_string();
        assert!(s.contains("checklist.items: must not be empty"), "{s}");
        assert!(s.contains("targets[0].target: is 262145 bytes; the limit is 262144 bytes"), "{s}");
    }

    #[test]
    fn checklist_round_trips_and_fills_ids() {
        let mut v = Violations::new();
        let p = pb::Checklist {
            id: "c".into(),
            items: vec![
                pb::ChecklistItem {
                    question: "a?".into(),
                    weight: Some(40.0),
                    category: "k".into(),
                    ..Default::default()
                },
                pb::ChecklistItem { question: "b?".into(), ..Default::default() },
            ],
            ..Default::default()
        };
        let c = checklist(Some(p), "checklist", &mut v);
        assert!(v.is_empty());
        assert_eq!(c.items[0].id, "1");
        assert_eq!(c.items[1].weight, 100.0);
        let back = checklist_to(&c);
        assert_eq!(back.items[0].weight, Some(40.0));
        assert_eq!(back.items[0].category, "k");
    }

    #[test]
    fn duplicate_ids_and_bad_weights_are_rejected() {
        let mut v = Violations::new();
        let p = pb::Checklist {
            items: vec![
                pb::ChecklistItem { id: "x".into(), question: "a?".into(), weight: Some(101.0), ..Default::default() },
                pb::ChecklistItem { id: "x".into(), question: "b?".into(), ..Default::default() },
            ],
            ..Default::default()
        };
        let _ = checklist(Some(p), "checklist", &mut v);
        let s = v.into_result().unwrap_err().to_string();
        assert!(s.contains("checklist.items[0].weight"), "{s}");
        assert!(s.contains("checklist.items[1].id: duplicate id"), "{s}");
    }

    #[test]
    fn sample_fields_and_the_uncertainty_round_trip() {
        let mut item = d::ItemScore::answered("q1", d::Answer::No);
        item.sample_answers = vec![Some(d::Answer::Yes), None, Some(d::Answer::No), Some(d::Answer::No)];
        item.yes_share = Some(1.0 / 3.0);
        item.flaky = true;
        item.abstentions = 1;
        let score = d::Score {
            item_scores: vec![item],
            sample_primary_scores: vec![1.0, 0.0, 0.0, 0.0],
            sample_spread: Some(0.5),
            abstentions: 1,
            answered_count: 1,
            ..Default::default()
        };
        let wire = score_to(&score);
        assert_eq!(wire.item_scores[0].sample_answers, vec![1, 0, 2, 2]);
        assert_eq!(score_from(wire), score);
        let aggregate = d::AggregateScores::compute([(&score, &d::Checklist::default())]);
        let u = aggregate.uncertainty.clone().expect("four observations");
        assert_eq!(aggregate_from(Some(aggregate_to(&aggregate))), aggregate);
        let wire = aggregate_to(&aggregate).uncertainty.unwrap();
        assert_eq!((wire.observations, wire.se, wire.ci_low), (4, u.se, u.ci.0));
        let settings = d::ScorerSettings { samples: Some(3), sample_models: vec!["j".into()], ..Default::default() };
        let mut v = Violations::new();
        assert_eq!(scorer_config(Some(scorer_settings_to(&settings)), "config", &mut v), settings);
        assert!(v.is_empty());
        let _ = scorer_config(Some(pb::ScorerConfig { samples: Some(0), ..Default::default() }), "config", &mut v);
        assert!(v.into_result().unwrap_err().to_string().contains("config.samples"));
    }
}
