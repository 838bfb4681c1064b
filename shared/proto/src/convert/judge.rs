//! The section judge panel (`ScorerService.JudgeSections`): wire <-> domain. Incoming requests are
//! checked field by field with full paths (`judges[1].model.temperature`, `sections[2].id`);
//! outgoing conversions are infallible.

use assay_domain as d;
use assay_domain::Violations;
use assay_domain::judge as dj;

use super::document::{brief, brief_to, criteria, criterion_to, section, section_to, sections, verdict, verdict_to};
use super::{model_record_from, model_record_to, model_spec, model_spec_to, usage_from, usage_to};
use crate::scorer::v1 as pb;

fn join(prefix: &str, field: &str) -> String {
    if prefix.is_empty() { field.to_string() } else { format!("{prefix}.{field}") }
}

/// A panel request from the wire, validated (field names are relative to `prefix`). Empty criteria
/// become the six defaults; an empty panel becomes the default three judges; empty judge ids become
/// "judge-<i+1>". The read-only context is checked against the judged sections
/// ([`dj::check_context`]: `context[i].id` repeating a judged id, limits, distinct indexes).
pub fn judge_sections_request(
    p: pb::JudgeSectionsRequest,
    prefix: &str,
) -> Result<dj::JudgeSectionsRequest, d::StageError> {
    let pb::JudgeSectionsRequest { sections: secs, brief: b, criteria: crit, judges, context: ctx } = p;
    let mut v = Violations::new();
    let sections_field = join(prefix, "sections");
    let sections = sections(secs, &sections_field, &mut v);
    let context: Vec<d::Section> = ctx.into_iter().map(section).collect();
    dj::check_context(&sections, &context, &sections_field, &join(prefix, "context"), &mut v);
    let brief = brief(b, &join(prefix, "brief"), &mut v);
    let criteria = criteria(crit, &join(prefix, "criteria"), &mut v);
    let judges_field = join(prefix, "judges");
    let judges: Vec<dj::PanelJudge> = judges
        .into_iter()
        .enumerate()
        .map(|(i, j)| {
            let pb::PanelJudge { id, model } = j;
            dj::PanelJudge { id, model: model_spec(model, &format!("{judges_field}[{i}].model"), &mut v) }
        })
        .collect();
    let judges = dj::panel_or_default(judges);
    dj::check_judges(&judges, &judges_field, &mut v);
    v.into_result()?;
    Ok(dj::JudgeSectionsRequest { sections, brief, criteria, judges, context })
}

/// A panel request on the wire (defaults already filled are sent explicitly).
pub fn judge_sections_request_to(r: &dj::JudgeSectionsRequest) -> pb::JudgeSectionsRequest {
    pb::JudgeSectionsRequest {
        sections: r.sections.iter().map(section_to).collect(),
        brief: Some(brief_to(&r.brief)),
        criteria: r.criteria.iter().map(criterion_to).collect(),
        judges: r
            .judges
            .iter()
            .map(|j| pb::PanelJudge { id: j.id.clone(), model: Some(model_spec_to(&j.model)) })
            .collect(),
        context: r.context.iter().map(section_to).collect(),
    }
}

pub fn judge_result_to(r: &dj::JudgeResult) -> pb::JudgeResult {
    pb::JudgeResult {
        judge_id: r.judge_id.clone(),
        verdict: r.verdict.as_ref().map(verdict_to),
        error: r.error.clone(),
        usage: Some(usage_to(&r.usage)),
        model_record: r.model_record.as_ref().map(model_record_to),
    }
}

/// A judge result from a scorer. The verdict is checked like any verdict from the wire (scores in
/// [0, 1], issues well formed); `field` names it in errors.
pub fn judge_result_from(p: pb::JudgeResult, field: &str, v: &mut Violations) -> dj::JudgeResult {
    let pb::JudgeResult { judge_id, verdict: verd, error, usage, model_record } = p;
    dj::JudgeResult {
        judge_id,
        verdict: verd.map(|x| verdict(x, &format!("{field}.verdict"), v)),
        error,
        usage: usage_from(usage),
        model_record: model_record.map(|r| model_record_from(Some(r))),
    }
}

pub fn judge_sections_response_to(o: &dj::PanelOutcome) -> pb::JudgeSectionsResponse {
    pb::JudgeSectionsResponse {
        results: o.results.iter().map(judge_result_to).collect(),
        succeeded: o.succeeded,
        failed: o.failed,
        usage: Some(usage_to(&o.usage)),
    }
}

/// A panel outcome from a scorer. A malformed reply (e.g. a score out of range) is an internal
/// error of the upstream scorer, not the caller's fault.
pub fn judge_sections_response_from(p: pb::JudgeSectionsResponse) -> Result<dj::PanelOutcome, d::StageError> {
    let pb::JudgeSectionsResponse { results, succeeded, failed, usage } = p;
    let mut v = Violations::new();
    let results =
        results.into_iter().enumerate().map(|(i, r)| judge_result_from(r, &format!("results[{i}]"), &mut v)).collect();
    v.into_result().map_err(|e| d::StageError::Internal(format!("the scorer sent a malformed panel result: {e}")))?;
    Ok(dj::PanelOutcome { results, succeeded, failed, usage: usage_from(usage) })
}

pub fn judge_finished_to(index: u32, r: &dj::JudgeResult) -> pb::JudgeFinished {
    pb::JudgeFinished { index, result: Some(judge_result_to(r)) }
}

/// A JudgeFinished event from a scorer (see [`judge_sections_response_from`] for errors).
pub fn judge_finished_from(p: pb::JudgeFinished) -> Result<dj::JudgeEvent, d::StageError> {
    let pb::JudgeFinished { index, result } = p;
    let mut v = Violations::new();
    let result = judge_result_from(result.unwrap_or_default(), "judge_finished.result", &mut v);
    v.into_result().map_err(|e| d::StageError::Internal(format!("the scorer sent a malformed judge result: {e}")))?;
    Ok(dj::JudgeEvent::JudgeFinished { index, result })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::v1 as common;

    fn section(id: &str, content: &str) -> common::Section {
        common::Section { id: id.into(), content: content.into(), ..Default::default() }
    }

    fn fields(e: d::StageError) -> Vec<String> {
        let d::StageError::InvalidArgument(vs) = e else { panic!("expected invalid argument, got {e:?}") };
        vs.into_iter().map(|v| v.field).collect()
    }

    #[test]
    fn defaults_are_filled() {
        let r = judge_sections_request(
            pb::JudgeSectionsRequest { sections: vec![section("a", "x")], ..Default::default() },
            "",
        )
        .unwrap();
        assert_eq!(r.criteria.len(), 6);
        assert_eq!(r.judges.len(), 3);
        assert_eq!(r.judges[2].model.temperature, Some(0.6));
        assert!(r.check().is_ok());
    }

    #[test]
    fn every_bad_field_is_named_with_its_path() {
        let req = pb::JudgeSectionsRequest {
            sections: vec![section("a", "x"), section("a", " ")],
            criteria: vec![common::Criterion { name: "c".into(), priority: 0, ..Default::default() }],
            judges: vec![
                pb::PanelJudge { id: "j".into(), model: None },
                pb::PanelJudge {
                    id: "j".into(),
                    model: Some(common::ModelSpec { temperature: Some(3.0), ..Default::default() }),
                },
            ],
            ..Default::default()
        };
        let f = fields(judge_sections_request(req, "request").unwrap_err());
        for want in [
            "request.sections[1].id",
            "request.sections[1].content",
            "request.criteria[0].priority",
            "request.judges[1].model.temperature",
            "request.judges[1].id",
        ] {
            assert!(f.iter().any(|x| x == want), "{want} missing from {f:?}");
        }
        let too_many = pb::JudgeSectionsRequest {
            sections: vec![section("a", "x")],
            judges: vec![pb::PanelJudge::default(); 10],
            ..Default::default()
        };
        assert_eq!(fields(judge_sections_request(too_many, "").unwrap_err()), vec!["judges".to_string()]);
    }

    #[test]
    fn context_ids_must_not_repeat_a_judged_section() {
        let at = |id: &str, index: u32| common::Section { index, ..section(id, "x") };
        let req = pb::JudgeSectionsRequest {
            sections: vec![at("a", 0), at("b", 1)],
            context: vec![at("b", 2), at("c", 1), at("d", 3)],
            ..Default::default()
        };
        let e = judge_sections_request(req, "request").unwrap_err();
        let text = e.to_string();
        assert!(text.contains("request.context[0].id: repeats the id \"b\" of request.sections[1]"), "{text}");
        assert!(text.contains("request.context[1].index: repeats index 1 of request.sections[1]"), "{text}");
        assert_eq!(fields(e), vec!["request.context[0].id".to_string(), "request.context[1].index".to_string()]);
    }

    #[test]
    fn request_and_outcome_round_trip() {
        let r = judge_sections_request(
            pb::JudgeSectionsRequest { sections: vec![section("a", "x")], ..Default::default() },
            "",
        )
        .unwrap();
        assert_eq!(judge_sections_request(judge_sections_request_to(&r), "").unwrap(), r);
        let focused = judge_sections_request(
            pb::JudgeSectionsRequest {
                sections: vec![section("a", "x")],
                context: vec![common::Section { index: 1, title: "Next".into(), ..section("b", "y") }],
                ..Default::default()
            },
            "",
        )
        .unwrap();
        assert_eq!(focused.context.len(), 1);
        assert_eq!(focused.context[0].title, "Next");
        assert_eq!(judge_sections_request(judge_sections_request_to(&focused), "").unwrap(), focused);

        let verdict = d::JudgeVerdict {
            judge_id: "judge-1".into(),
            model: "m".into(),
            criterion_scores: [("clarity_readability".to_string(), 0.5)].into_iter().collect(),
            overall_score: 0.5,
            model_record: Some(d::ModelRecord { phase: dj::JUDGE_PHASE.into(), ..Default::default() }),
            ..Default::default()
        };
        let outcome = dj::PanelOutcome::from_results(vec![
            dj::JudgeResult {
                judge_id: "judge-1".into(),
                verdict: Some(verdict),
                model_record: Some(d::ModelRecord::default()),
                ..Default::default()
            },
            dj::JudgeResult { judge_id: "judge-2".into(), error: "timeout".into(), ..Default::default() },
        ]);
        let back = judge_sections_response_from(judge_sections_response_to(&outcome)).unwrap();
        assert_eq!(back, outcome);
        let dj::JudgeEvent::JudgeFinished { index, result } =
            judge_finished_from(judge_finished_to(1, &outcome.results[1])).unwrap();
        assert_eq!((index, result), (1, outcome.results[1].clone()));
    }
}
