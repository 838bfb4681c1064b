//! Wire <-> domain conversions of self-refine (`assay.refiners.v1.SelfRefine*`). Wire -> domain
//! collects every invalid field with its full path, then runs the domain's own checks (so the
//! library and the wire give the same errors); domain -> wire is infallible, and so is reading a
//! response back (unknown enum values fall back to defaults).

use assay_domain::self_refine::{
    DEFAULT_MAX_PASSES, DEFAULT_MIN_BYTES, OriginalSimilarity, SelfRefineHook, SelfRefineOutcome, SelfRefinePass,
    SelfRefineRequest, StopReason,
};
use assay_domain::similarity::{CompareOutcome, ConvergenceMode, DecidedBy, JaccardScore};
use assay_domain::{StageError, Violations};

use crate::convert::{enum_value, model_record_from, model_record_to, model_spec, model_spec_to, usage_from, usage_to};
use crate::refiners::v1 as pb;

fn join(prefix: &str, field: &str) -> String {
    if prefix.is_empty() { field.to_string() } else { format!("{prefix}.{field}") }
}

/// A SelfRefine request from the wire, validated; field paths are relative to `prefix`. Unset
/// `max_passes` / `min_bytes` take the reference defaults (1 / 200); an unspecified mode is
/// permissive.
pub fn self_refine_request(p: pb::SelfRefineRequest, prefix: &str) -> Result<SelfRefineRequest, StageError> {
    let pb::SelfRefineRequest {
        draft,
        instruction,
        max_passes,
        min_bytes,
        convergence_mode,
        model,
        embedding_model,
        prior_passes,
        passes_this_call,
        embedding_step,
    } = p;
    let mut v = Violations::new();
    let mode = convergence_mode_from(convergence_mode, &join(prefix, "convergence_mode"), &mut v);
    let request = SelfRefineRequest {
        draft,
        instruction,
        max_passes: max_passes.unwrap_or(DEFAULT_MAX_PASSES),
        min_bytes: min_bytes.unwrap_or(DEFAULT_MIN_BYTES),
        mode,
        embedding_step,
        model: model_spec(model, &join(prefix, "model"), &mut v),
        embedding_model: model_spec(embedding_model, &join(prefix, "embedding_model"), &mut v),
        prior_passes: prior_passes.into_iter().map(pass_from).collect(),
        passes_this_call: passes_this_call.unwrap_or(0),
    };
    // The spec checks above already named their fields; the domain's repeat them, so keep the
    // domain's text checks only when the wire found nothing else wrong with the specs.
    let mut domain = Violations::new();
    request.check(prefix, &mut domain);
    if let Err(StageError::InvalidArgument(found)) = domain.into_result() {
        let model_fields = [join(prefix, "model."), join(prefix, "embedding_model.")];
        for f in found {
            if !model_fields.iter().any(|m| f.field.starts_with(m.as_str())) {
                v.push(f.field, f.description);
            }
        }
    }
    v.into_result()?;
    Ok(request)
}

/// A self-refine hook from the wire; invalid fields are added to `v` with their paths under
/// `prefix`. Unset `max_passes` / `min_bytes` take the loop's defaults (1 / 200).
pub fn self_refine_hook(p: pb::SelfRefineHook, prefix: &str, v: &mut Violations) -> SelfRefineHook {
    let pb::SelfRefineHook { max_passes, min_bytes, exclude, convergence_mode, model, embedding_model, embedding_step } =
        p;
    let hook = SelfRefineHook {
        max_passes: max_passes.unwrap_or(DEFAULT_MAX_PASSES),
        min_bytes: min_bytes.unwrap_or(DEFAULT_MIN_BYTES),
        exclude,
        mode: convergence_mode_from(convergence_mode, &join(prefix, "convergence_mode"), v),
        embedding_step,
        model: model_spec(model, &join(prefix, "model"), v),
        embedding_model: model_spec(embedding_model, &join(prefix, "embedding_model"), v),
    };
    hook.check_fields(prefix, v);
    hook
}

fn convergence_mode_from(value: i32, field: &str, v: &mut Violations) -> ConvergenceMode {
    match enum_value::<pb::ConvergenceMode>(value, field, "0 unspecified, 1 permissive, 2 strict", v) {
        Some(pb::ConvergenceMode::Strict) => ConvergenceMode::Strict,
        Some(pb::ConvergenceMode::Permissive | pb::ConvergenceMode::Unspecified) | None => ConvergenceMode::Permissive,
    }
}

/// The streaming form's request (`request` is required; fields are under `request.`).
pub fn self_refine_stream_request(p: pb::SelfRefineStreamRequest) -> Result<SelfRefineRequest, StageError> {
    let pb::SelfRefineStreamRequest { request } = p;
    match request {
        Some(r) => self_refine_request(r, "request"),
        None => Err(StageError::invalid("request", "is required")),
    }
}

pub fn self_refine_request_to(r: &SelfRefineRequest) -> pb::SelfRefineRequest {
    pb::SelfRefineRequest {
        draft: r.draft.clone(),
        instruction: r.instruction.clone(),
        max_passes: Some(r.max_passes),
        min_bytes: Some(r.min_bytes),
        convergence_mode: match r.mode {
            ConvergenceMode::Permissive => pb::ConvergenceMode::Permissive,
            ConvergenceMode::Strict => pb::ConvergenceMode::Strict,
        } as i32,
        model: Some(model_spec_to(&r.model)),
        embedding_model: Some(model_spec_to(&r.embedding_model)),
        prior_passes: r.prior_passes.iter().map(pass_to).collect(),
        passes_this_call: (r.passes_this_call > 0).then_some(r.passes_this_call),
        embedding_step: r.embedding_step,
    }
}

pub fn pass_to(p: &SelfRefinePass) -> pb::SelfRefinePass {
    let SelfRefinePass {
        pass,
        critique,
        revised,
        revised_block_missing,
        comparison,
        original_similarity,
        converged,
        rolled_back,
        error,
        usage,
    } = p;
    let mut out = pb::SelfRefinePass {
        pass: *pass,
        critique: critique.clone(),
        revised: revised.clone(),
        converged: *converged,
        rolled_back: *rolled_back,
        error: error.clone(),
        revised_block_missing: *revised_block_missing,
        usage: Some(usage_to(usage)),
        ..Default::default()
    };
    if let Some(c) = comparison {
        let CompareOutcome {
            converged: _,
            diverged,
            decided_by,
            char_similarity,
            jaccard,
            embedding_cosine,
            degraded_from,
            degraded_reason,
            embedding_cached,
        } = c;
        out.char_similarity = *char_similarity;
        out.jaccard = jaccard.map(|j| j.similarity);
        out.jaccard_confidence = jaccard.map(|j| j.confidence);
        out.cosine = *embedding_cosine;
        out.diverged = *diverged;
        out.decided_by = decided_by.as_str().to_string();
        out.degraded_from = degraded_from.clone().unwrap_or_default();
        out.degraded_reason = degraded_reason.clone();
        out.embedding_cached = *embedding_cached;
    }
    if let Some(g) = original_similarity {
        let OriginalSimilarity { similarity, measure, threshold, degraded_reason } = g;
        out.similarity_to_original = Some(*similarity);
        out.similarity_measure = measure.as_str().to_string();
        out.rollback_threshold = *threshold;
        out.similarity_degraded_reason = degraded_reason.clone();
    }
    out
}

/// A pass from the wire. The comparison is present when `decided_by` names a cascade step, the
/// guard's figures when `similarity_to_original` is set.
pub fn pass_from(p: pb::SelfRefinePass) -> SelfRefinePass {
    let pb::SelfRefinePass {
        pass,
        critique,
        revised,
        char_similarity,
        jaccard,
        cosine,
        converged,
        rolled_back,
        degraded_from,
        error,
        diverged,
        decided_by,
        jaccard_confidence,
        degraded_reason,
        embedding_cached,
        similarity_to_original,
        similarity_measure,
        rollback_threshold,
        revised_block_missing,
        usage,
        similarity_degraded_reason,
    } = p;
    let comparison = DecidedBy::parse(&decided_by).map(|decided_by| CompareOutcome {
        converged,
        diverged,
        decided_by,
        char_similarity,
        jaccard: jaccard.map(|similarity| JaccardScore { similarity, confidence: jaccard_confidence.unwrap_or(0.0) }),
        embedding_cosine: cosine,
        degraded_from: Some(degraded_from).filter(|s| !s.is_empty()),
        degraded_reason,
        embedding_cached,
    });
    let original_similarity = similarity_to_original.map(|similarity| OriginalSimilarity {
        similarity,
        measure: DecidedBy::parse(&similarity_measure).unwrap_or(DecidedBy::Jaccard),
        threshold: rollback_threshold,
        degraded_reason: similarity_degraded_reason,
    });
    SelfRefinePass {
        pass,
        critique,
        revised,
        revised_block_missing,
        comparison,
        original_similarity,
        converged,
        rolled_back,
        error,
        usage: usage_from(usage),
    }
}

fn stop_reason_to(s: StopReason) -> pb::SelfRefineStopReason {
    match s {
        StopReason::Converged => pb::SelfRefineStopReason::Converged,
        StopReason::MaxPasses => pb::SelfRefineStopReason::MaxPasses,
        StopReason::RolledBack => pb::SelfRefineStopReason::RolledBack,
        StopReason::RefinerError => pb::SelfRefineStopReason::RefinerError,
        StopReason::TooShort => pb::SelfRefineStopReason::TooShort,
    }
}

fn stop_reason_from(s: i32) -> StopReason {
    match pb::SelfRefineStopReason::try_from(s) {
        Ok(pb::SelfRefineStopReason::Converged) => StopReason::Converged,
        Ok(pb::SelfRefineStopReason::RolledBack) => StopReason::RolledBack,
        Ok(pb::SelfRefineStopReason::RefinerError) => StopReason::RefinerError,
        Ok(pb::SelfRefineStopReason::TooShort) => StopReason::TooShort,
        Ok(pb::SelfRefineStopReason::MaxPasses | pb::SelfRefineStopReason::Unspecified) | Err(_) => {
            StopReason::MaxPasses
        }
    }
}

pub fn self_refine_response_to(o: &SelfRefineOutcome) -> pb::SelfRefineResponse {
    let SelfRefineOutcome {
        final_text,
        passes,
        converged,
        skipped_too_short,
        rolled_back,
        degraded_from,
        stop_reason,
        changed,
        usage,
        model,
        returned_pass,
    } = o;
    pb::SelfRefineResponse {
        final_text: final_text.clone(),
        passes: passes.iter().map(pass_to).collect(),
        converged: *converged,
        skipped_too_short: *skipped_too_short,
        usage: Some(usage_to(usage)),
        // A skipped call used no model: no record.
        model: (!*skipped_too_short).then(|| model_record_to(model)),
        rolled_back: *rolled_back,
        degraded_from: degraded_from.clone().unwrap_or_default(),
        stop_reason: stop_reason_to(*stop_reason) as i32,
        changed: *changed,
        returned_pass: *returned_pass,
    }
}

pub fn self_refine_response_from(p: pb::SelfRefineResponse) -> SelfRefineOutcome {
    let pb::SelfRefineResponse {
        final_text,
        passes,
        converged,
        skipped_too_short,
        usage,
        model,
        rolled_back,
        degraded_from,
        stop_reason,
        changed,
        returned_pass,
    } = p;
    SelfRefineOutcome {
        final_text,
        passes: passes.into_iter().map(pass_from).collect(),
        converged,
        skipped_too_short,
        rolled_back,
        degraded_from: Some(degraded_from).filter(|s| !s.is_empty()),
        stop_reason: stop_reason_from(stop_reason),
        changed,
        usage: usage_from(usage),
        model: model_record_from(model),
        returned_pass,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::v1 as common;
    use assay_domain::{ModelRecord, Usage};

    #[test]
    fn defaults_fill_unset_fields() {
        let r = self_refine_request(pb::SelfRefineRequest { draft: "text".into(), ..Default::default() }, "").unwrap();
        assert_eq!((r.max_passes, r.min_bytes, r.mode), (1, 200, ConvergenceMode::Permissive));
        let r = self_refine_request(
            pb::SelfRefineRequest {
                draft: "text".into(),
                max_passes: Some(2),
                min_bytes: Some(0),
                convergence_mode: pb::ConvergenceMode::Strict as i32,
                ..Default::default()
            },
            "",
        )
        .unwrap();
        assert_eq!((r.max_passes, r.min_bytes, r.mode, r.embedding_step), (2, 0, ConvergenceMode::Strict, None));
        assert_eq!(self_refine_request(self_refine_request_to(&r), "").unwrap(), r);
        let on = SelfRefineRequest { embedding_step: Some(true), ..r };
        assert_eq!(self_refine_request(self_refine_request_to(&on), "").unwrap(), on);
    }

    #[test]
    fn bad_fields_are_named_once_with_their_path() {
        let e = self_refine_request(
            pb::SelfRefineRequest {
                draft: "  ".into(),
                max_passes: Some(0),
                convergence_mode: 7,
                model: Some(common::ModelSpec { temperature: Some(3.0), ..Default::default() }),
                ..Default::default()
            },
            "request",
        )
        .unwrap_err();
        let StageError::InvalidArgument(vs) = e else { panic!("{e:?}") };
        let fields: Vec<&str> = vs.iter().map(|v| v.field.as_str()).collect();
        assert_eq!(
            fields,
            vec!["request.convergence_mode", "request.model.temperature", "request.draft", "request.max_passes"]
        );
        let e = self_refine_stream_request(pb::SelfRefineStreamRequest { request: None }).unwrap_err();
        assert_eq!(e, StageError::invalid("request", "is required"));
    }

    #[test]
    fn passes_and_outcomes_round_trip() {
        let compared = SelfRefinePass {
            pass: 2,
            critique: vec!["vague".into(), "no example".into()],
            revised: "better".into(),
            revised_block_missing: true,
            comparison: Some(CompareOutcome {
                converged: false,
                diverged: false,
                decided_by: DecidedBy::Jaccard,
                char_similarity: 0.5,
                jaccard: Some(JaccardScore { similarity: 0.9, confidence: 0.4 }),
                embedding_cosine: None,
                degraded_from: Some("embedding".into()),
                degraded_reason: "embedding circuit breaker is open".into(),
                embedding_cached: false,
            }),
            original_similarity: Some(OriginalSimilarity {
                similarity: 0.7,
                measure: DecidedBy::Jaccard,
                threshold: Some(0.8),
                degraded_reason: "embedding circuit breaker is open".into(),
            }),
            converged: false,
            rolled_back: true,
            error: String::new(),
            usage: Usage { calls: 1, prompt_tokens: 10, completion_tokens: 5, ..Default::default() },
        };
        let failed = SelfRefinePass { pass: 3, error: "model backend unavailable".into(), ..Default::default() };
        for p in [&compared, &failed] {
            assert_eq!(&pass_from(pass_to(p)), p);
        }
        let o = SelfRefineOutcome {
            final_text: "better".into(),
            passes: vec![compared, failed],
            converged: false,
            skipped_too_short: false,
            rolled_back: true,
            degraded_from: Some("embedding".into()),
            stop_reason: StopReason::RolledBack,
            changed: true,
            usage: Usage { calls: 2, ..Default::default() },
            model: ModelRecord { phase: "self_refine".into(), ..Default::default() },
            returned_pass: 1,
        };
        assert_eq!(self_refine_response_to(&o).returned_pass, 1);
        assert_eq!(self_refine_response_from(self_refine_response_to(&o)), o);
        let skipped = SelfRefineOutcome {
            final_text: "short".into(),
            skipped_too_short: true,
            stop_reason: StopReason::TooShort,
            ..Default::default()
        };
        let wire = self_refine_response_to(&skipped);
        assert!(wire.model.is_none());
        assert_eq!(wire.stop_reason, pb::SelfRefineStopReason::TooShort as i32);
        assert_eq!(self_refine_response_from(wire), skipped);
    }
}
