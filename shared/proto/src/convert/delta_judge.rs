//! Delta judge Verify, CompareTexts and CheckConsistency: wire <-> domain. Incoming requests are checked field by field
//! with full paths; outgoing conversions are infallible.

use assay_domain as d;
use assay_domain::Violations;
use assay_domain::verify as dv;

use super::document::{issue, issue_to, section, section_to};
use super::{enum_value, model_record_from, model_record_to, model_spec, model_spec_to, usage_from, usage_to};
use crate::delta_judge::v1 as pb;

fn join(prefix: &str, field: &str) -> String {
    if prefix.is_empty() { field.to_string() } else { format!("{prefix}.{field}") }
}

/// Verify request from the wire, validated (field names relative to `prefix`). Empty issue ids
/// become `"1".."n"`; unset length ratios take 0.5 and 2.0.
pub fn verify_request(p: pb::VerifyRequest, prefix: &str) -> Result<dv::VerifyRequest, d::StageError> {
    let pb::VerifyRequest {
        before,
        after,
        issues,
        locks,
        criterion_scores,
        model,
        min_length_ratio,
        max_length_ratio,
        min_fix_confidence,
    } = p;
    let mut v = Violations::new();
    let required = |s: Option<crate::common::v1::Section>, name: &str, v: &mut Violations| match s {
        Some(s) => section(s),
        None => {
            v.push(join(prefix, name), "is required");
            d::Section::default()
        }
    };
    let before = required(before, "before", &mut v);
    let after = required(after, "after", &mut v);
    // Count before converting so an oversized list is refused without walking it.
    let issues = if issues.len() > dv::MAX_VERIFY_ISSUES {
        v.push(join(prefix, "issues"), format!("has {} issues; the limit is {}", issues.len(), dv::MAX_VERIFY_ISSUES));
        Vec::new()
    } else {
        issues
            .into_iter()
            .enumerate()
            .map(|(i, it)| {
                let mut out = issue(it, &join(prefix, &format!("issues[{i}]")), &mut v);
                if out.id.is_empty() {
                    out.id = (i + 1).to_string();
                }
                out
            })
            .collect()
    };
    let locks = locks
        .into_iter()
        .map(|pb::QualityLock { criterion, baseline, max_drop }| dv::QualityLock { criterion, baseline, max_drop })
        .collect();
    let model = model_spec(model, &join(prefix, "model"), &mut v);
    let request = dv::VerifyRequest {
        before,
        after,
        issues,
        locks,
        criterion_scores: criterion_scores.into_iter().collect(),
        model,
        min_length_ratio: min_length_ratio.unwrap_or(dv::DEFAULT_MIN_LENGTH_RATIO),
        max_length_ratio: max_length_ratio.unwrap_or(dv::DEFAULT_MAX_LENGTH_RATIO),
        min_fix_confidence,
    };
    request.check(prefix, &mut v);
    v.into_result()?;
    Ok(request)
}

pub fn verify_request_to(r: &dv::VerifyRequest) -> pb::VerifyRequest {
    pb::VerifyRequest {
        before: Some(section_to(&r.before)),
        after: Some(section_to(&r.after)),
        issues: r.issues.iter().map(issue_to).collect(),
        locks: r
            .locks
            .iter()
            .map(|l| pb::QualityLock { criterion: l.criterion.clone(), baseline: l.baseline, max_drop: l.max_drop })
            .collect(),
        criterion_scores: r.criterion_scores.clone().into_iter().collect(),
        model: Some(model_spec_to(&r.model)),
        min_length_ratio: Some(r.min_length_ratio),
        max_length_ratio: Some(r.max_length_ratio),
        min_fix_confidence: r.min_fix_confidence,
    }
}

pub fn readability_to(r: &dv::ReadabilityReport) -> pb::ReadabilityResponse {
    pb::ReadabilityResponse {
        average_sentence_words: r.average_sentence_words,
        max_sentence_words: r.max_sentence_words,
        paragraph_break_ratio: r.paragraph_break_ratio,
        sentences: r.sentences,
        paragraphs: r.paragraphs,
        long_sentences: r.long_sentences.clone(),
        dense_text: r.dense_text,
        within_targets: r.within_targets,
    }
}

pub fn readability_from(p: Option<pb::ReadabilityResponse>) -> dv::ReadabilityReport {
    let pb::ReadabilityResponse {
        average_sentence_words,
        max_sentence_words,
        paragraph_break_ratio,
        sentences,
        paragraphs,
        long_sentences,
        dense_text,
        within_targets,
    } = p.unwrap_or_default();
    dv::ReadabilityReport {
        average_sentence_words,
        max_sentence_words,
        paragraph_break_ratio,
        sentences,
        paragraphs,
        long_sentences,
        dense_text,
        within_targets,
    }
}

pub fn lock_violation_to(l: &dv::LockViolation) -> pb::LockViolation {
    pb::LockViolation { criterion: l.criterion.clone(), baseline: l.baseline, current: l.current, max_drop: l.max_drop }
}

pub fn verify_response_to(o: &dv::VerifyOutcome) -> pb::VerifyResponse {
    pb::VerifyResponse {
        heuristics: o
            .heuristics
            .iter()
            .map(|h| pb::HeuristicCheck { name: h.name.clone(), passed: h.passed, detail: h.detail.clone() })
            .collect(),
        issues: o
            .issues
            .iter()
            .map(|i| pb::IssueVerification {
                issue_id: i.issue_id.clone(),
                fixed: i.fixed,
                confidence: i.confidence,
                error: i.error.clone(),
                answer: answer_to(i.answer).to_string(),
            })
            .collect(),
        lock_violations: o.lock_violations.iter().map(lock_violation_to).collect(),
        accepted: o.accepted,
        readability: Some(readability_to(&o.readability)),
        usage: Some(usage_to(&o.usage)),
        model: Some(model_record_to(&o.model)),
        rejection_reasons: o.rejection_reasons.clone(),
        logprobs_unavailable: o.logprobs_unavailable,
        notes: o.notes.clone(),
    }
}

/// `"YES"`, `"NO"`, or empty for no answer.
fn answer_to(a: Option<d::Answer>) -> &'static str {
    match a {
        Some(d::Answer::Yes) => "YES",
        Some(d::Answer::No) => "NO",
        None => "",
    }
}

pub fn verify_response_from(p: pb::VerifyResponse) -> dv::VerifyOutcome {
    let pb::VerifyResponse {
        heuristics,
        issues,
        lock_violations,
        accepted,
        readability,
        usage,
        model,
        rejection_reasons,
        logprobs_unavailable,
        notes,
    } = p;
    dv::VerifyOutcome {
        heuristics: heuristics
            .into_iter()
            .map(|pb::HeuristicCheck { name, passed, detail }| dv::HeuristicCheck { name, passed, detail })
            .collect(),
        issues: issues
            .into_iter()
            .map(|pb::IssueVerification { issue_id, fixed, confidence, error, answer }| dv::IssueVerification {
                issue_id,
                fixed,
                confidence,
                error,
                answer: d::Answer::parse(&answer),
            })
            .collect(),
        lock_violations: lock_violations
            .into_iter()
            .map(|pb::LockViolation { criterion, baseline, current, max_drop }| dv::LockViolation {
                criterion,
                baseline,
                current,
                max_drop,
            })
            .collect(),
        accepted,
        readability: readability_from(readability),
        usage: usage_from(usage),
        model: model_record_from(model),
        rejection_reasons,
        logprobs_unavailable,
        notes,
    }
}

/// CompareTexts request from the wire, validated. Unset mode is permissive.
pub fn compare_request(p: pb::CompareTextsRequest, prefix: &str) -> Result<dv::CompareRequest, d::StageError> {
    let pb::CompareTextsRequest { previous, current, mode, embedding_model } = p;
    let mut v = Violations::new();
    let mode = match enum_value::<pb::ConvergenceMode>(
        mode,
        &join(prefix, "mode"),
        "0 unspecified, 1 permissive, 2 strict",
        &mut v,
    ) {
        Some(pb::ConvergenceMode::Strict) => dv::ConvergenceMode::Strict,
        Some(pb::ConvergenceMode::Permissive | pb::ConvergenceMode::Unspecified) | None => {
            dv::ConvergenceMode::Permissive
        }
    };
    let embedding_model = model_spec(embedding_model, &join(prefix, "embedding_model"), &mut v);
    let request = dv::CompareRequest { previous, current, mode, embedding_model };
    request.check(prefix, &mut v);
    v.into_result()?;
    Ok(request)
}

pub fn compare_request_to(r: &dv::CompareRequest) -> pb::CompareTextsRequest {
    pb::CompareTextsRequest {
        previous: r.previous.clone(),
        current: r.current.clone(),
        mode: match r.mode {
            dv::ConvergenceMode::Permissive => pb::ConvergenceMode::Permissive,
            dv::ConvergenceMode::Strict => pb::ConvergenceMode::Strict,
        } as i32,
        embedding_model: Some(model_spec_to(&r.embedding_model)),
    }
}

pub fn compare_response_to(o: &dv::CompareOutcome) -> pb::CompareTextsResponse {
    pb::CompareTextsResponse {
        converged: o.converged,
        diverged: o.diverged,
        decided_by: o.decided_by.as_str().to_string(),
        char_similarity: o.char_similarity,
        jaccard: o.jaccard.map(|j| j.similarity),
        jaccard_confidence: o.jaccard.map(|j| j.confidence),
        embedding_cosine: o.embedding_cosine,
        degraded_from: o.degraded_from.clone().unwrap_or_default(),
        degraded_reason: o.degraded_reason.clone(),
        embedding_cached: o.embedding_cached,
    }
}

pub fn compare_response_from(p: pb::CompareTextsResponse) -> dv::CompareOutcome {
    let pb::CompareTextsResponse {
        converged,
        diverged,
        decided_by,
        char_similarity,
        jaccard,
        jaccard_confidence,
        embedding_cosine,
        degraded_from,
        degraded_reason,
        embedding_cached,
    } = p;
    dv::CompareOutcome {
        converged,
        diverged,
        decided_by: dv::DecidedBy::parse(&decided_by).unwrap_or_default(),
        char_similarity,
        jaccard: jaccard
            .map(|similarity| dv::JaccardScore { similarity, confidence: jaccard_confidence.unwrap_or(0.0) }),
        embedding_cosine,
        degraded_from: Some(degraded_from).filter(|s| !s.is_empty()),
        degraded_reason,
        embedding_cached,
    }
}

/// CheckConsistency request from the wire, validated (field names relative to `prefix`): both
/// sections required, non-empty and within the text limit.
pub fn consistency_request(
    p: pb::CheckConsistencyRequest,
    prefix: &str,
) -> Result<dv::ConsistencyRequest, d::StageError> {
    let pb::CheckConsistencyRequest { previous, section: current, model } = p;
    let mut v = Violations::new();
    let mut required = |s: Option<crate::common::v1::Section>, name: &str| match s {
        Some(s) => section(s),
        None => {
            v.push(join(prefix, name), "is required");
            d::Section::default()
        }
    };
    let previous = required(previous, "previous");
    let current = required(current, "section");
    let model = model_spec(model, &join(prefix, "model"), &mut v);
    let request = dv::ConsistencyRequest { previous, section: current, model };
    request.check(prefix, &mut v);
    v.into_result()?;
    Ok(request)
}

pub fn consistency_request_to(r: &dv::ConsistencyRequest) -> pb::CheckConsistencyRequest {
    pb::CheckConsistencyRequest {
        previous: Some(section_to(&r.previous)),
        section: Some(section_to(&r.section)),
        model: Some(model_spec_to(&r.model)),
    }
}

pub fn consistency_response_to(o: &dv::ConsistencyOutcome) -> pb::CheckConsistencyResponse {
    pb::CheckConsistencyResponse {
        consistent: o.consistent,
        reason: o.reason.clone(),
        confidence: o.confidence,
        usage: Some(usage_to(&o.usage)),
        model: o.model.as_ref().map(model_record_to),
    }
}

pub fn consistency_response_from(p: pb::CheckConsistencyResponse) -> dv::ConsistencyOutcome {
    let pb::CheckConsistencyResponse { consistent, reason, confidence, usage, model } = p;
    dv::ConsistencyOutcome {
        consistent,
        reason,
        confidence,
        usage: usage_from(usage),
        model: model.map(|m| model_record_from(Some(m))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::v1 as common;

    fn sec(id: &str, content: &str) -> common::Section {
        common::Section { id: id.into(), content: content.into(), ..Default::default() }
    }

    #[test]
    fn verify_request_collects_every_bad_field() {
        let req = pb::VerifyRequest {
            before: None,
            after: Some(sec("s1", "")),
            issues: vec![common::JudgeIssue {
                criterion: "clarity".into(),
                severity: 9,
                description: "d".into(),
                ..Default::default()
            }],
            criterion_scores: [("clarity".to_string(), 1.2)].into(),
            model: Some(common::ModelSpec { temperature: Some(3.0), ..Default::default() }),
            ..Default::default()
        };
        let e = verify_request(req, "").unwrap_err().to_string();
        for f in [
            "before: is required",
            "after.content: must not be empty",
            "issues[0].severity: unknown enum value 9",
            "criterion_scores[\"clarity\"]",
            "model.temperature",
        ] {
            assert!(e.contains(f), "{f} missing from {e}");
        }
    }

    #[test]
    fn verify_round_trips_with_defaults_and_ids() {
        let req = pb::VerifyRequest {
            before: Some(sec("s1", "old")),
            after: Some(sec("s1", "new")),
            issues: vec![common::JudgeIssue {
                criterion: "clarity".into(),
                severity: common::Severity::Major as i32,
                description: "d".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let d = verify_request(req, "").unwrap();
        assert_eq!((d.min_length_ratio, d.max_length_ratio), (0.5, 2.0));
        assert_eq!(d.issues[0].id, "1");
        let back = verify_request(verify_request_to(&d), "").unwrap();
        assert_eq!(back, d);
    }

    #[test]
    fn consistency_round_trips_and_names_bad_fields() {
        let e = consistency_request(
            pb::CheckConsistencyRequest { previous: None, section: Some(sec("s2", " ")), model: None },
            "r",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("r.previous: is required") && e.contains("r.section.content: must not be empty"), "{e}");
        let e = consistency_request(
            pb::CheckConsistencyRequest { previous: Some(sec("s1", "a")), section: Some(sec("s1", "b")), model: None },
            "",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("section.id"), "{e}");
        let req = consistency_request(
            pb::CheckConsistencyRequest { previous: Some(sec("s1", "a")), section: Some(sec("s2", "b")), model: None },
            "",
        )
        .unwrap();
        assert_eq!(consistency_request(consistency_request_to(&req), "").unwrap(), req);
        let o = dv::ConsistencyOutcome {
            consistent: false,
            reason: "the term changed".into(),
            confidence: Some(0.8),
            usage: d::Usage { calls: 1, ..Default::default() },
            model: Some(d::ModelRecord { phase: "stage_6_delta_judge".into(), ..Default::default() }),
        };
        assert_eq!(consistency_response_from(consistency_response_to(&o)), o);
    }

    #[test]
    fn verify_carries_min_fix_confidence_answers_and_notes() {
        let req = pb::VerifyRequest {
            before: Some(sec("s1", "old")),
            after: Some(sec("s1", "new")),
            min_fix_confidence: Some(1.5),
            ..Default::default()
        };
        let e = verify_request(req.clone(), "").unwrap_err().to_string();
        assert!(e.contains("min_fix_confidence"), "{e}");
        let d = verify_request(pb::VerifyRequest { min_fix_confidence: Some(0.6), ..req }, "").unwrap();
        assert_eq!(d.min_fix_confidence, Some(0.6));
        assert_eq!(verify_request(verify_request_to(&d), "").unwrap(), d);
        let o = dv::VerifyOutcome {
            issues: vec![dv::IssueVerification {
                issue_id: "i".into(),
                fixed: false,
                confidence: Some(0.55),
                answer: Some(d::Answer::Yes),
                error: String::new(),
            }],
            notes: vec!["shorter sentences".into()],
            ..Default::default()
        };
        let back = verify_response_from(verify_response_to(&o));
        assert_eq!(back.issues, o.issues);
        assert_eq!(back.notes, o.notes);
    }

    #[test]
    fn compare_round_trips_and_checks_texts() {
        let e = compare_request(pb::CompareTextsRequest { mode: 7, ..Default::default() }, "r").unwrap_err();
        let s = e.to_string();
        assert!(s.contains("r.mode") && s.contains("r.previous: must not be empty") && s.contains("r.current"), "{s}");
        let o = dv::CompareOutcome {
            converged: true,
            decided_by: dv::DecidedBy::Jaccard,
            char_similarity: 0.5,
            jaccard: Some(dv::JaccardScore { similarity: 0.96, confidence: 0.7 }),
            degraded_from: Some("embedding".into()),
            degraded_reason: "down".into(),
            ..Default::default()
        };
        assert_eq!(compare_response_from(compare_response_to(&o)), o);
    }
}
