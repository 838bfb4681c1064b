//! Wire <-> domain conversions of the generator's messages. Wire -> domain validates enums and
//! collects every invalid field with its path; domain -> wire is infallible.

use assay_domain::generator::{
    AugmentationMode, Candidate, CorpusOutcome, CorpusPreset, CorpusProgress, CorpusRefinement, CorpusRequest,
    Dimension, GenerateOutcome, GenerateRequest, Preset, PresetId, PresetInfo, RespondOutcome, RespondRequest,
    SubDimension,
};
use assay_domain::{FieldViolation, GenerationLevel, StageError, Violations};

use crate::common::v1 as common;
use crate::convert;
use crate::generator::v1 as pb;

const INSTANCE_PRESETS: &str = "tick, rocketeval, rlcf_direct, rlcf_candidate, rlcf_candidates_only, \
     openrubrics_pairwise, openrubrics_listwise";

/// The domain preset of a wire value; unknown, unspecified and corpus-level values are violations
/// of `field`.
pub fn preset_from(value: i32, field: &str) -> Result<Preset, FieldViolation> {
    let p = pb::Preset::try_from(value).map_err(|_| {
        FieldViolation::new(field, format!("unknown enum value {value} (instance presets: {INSTANCE_PRESETS})"))
    })?;
    match p {
        pb::Preset::Unspecified => {
            Err(FieldViolation::new(field, format!("is required (instance presets: {INSTANCE_PRESETS})")))
        }
        pb::Preset::Feedback | pb::Preset::Checkeval | pb::Preset::Interacteval => {
            Err(FieldViolation::new(field, format!("{} is a corpus-level preset: use GenerateCorpus", p.as_str_name())))
        }
        pb::Preset::Tick => Ok(Preset::Tick),
        pb::Preset::Rocketeval => Ok(Preset::RocketEval),
        pb::Preset::RlcfDirect => Ok(Preset::RlcfDirect),
        pb::Preset::RlcfCandidate => Ok(Preset::RlcfCandidate),
        pb::Preset::RlcfCandidatesOnly => Ok(Preset::RlcfCandidatesOnly),
        pb::Preset::OpenrubricsPairwise => Ok(Preset::OpenRubricsPairwise),
        pb::Preset::OpenrubricsListwise => Ok(Preset::OpenRubricsListwise),
    }
}

/// The wire value of a domain preset.
pub fn preset_to(p: Preset) -> pb::Preset {
    match p {
        Preset::Tick => pb::Preset::Tick,
        Preset::RocketEval => pb::Preset::Rocketeval,
        Preset::RlcfDirect => pb::Preset::RlcfDirect,
        Preset::RlcfCandidate => pb::Preset::RlcfCandidate,
        Preset::RlcfCandidatesOnly => pb::Preset::RlcfCandidatesOnly,
        Preset::OpenRubricsPairwise => pb::Preset::OpenrubricsPairwise,
        Preset::OpenRubricsListwise => pb::Preset::OpenrubricsListwise,
    }
}

const CORPUS_PRESETS: &str = "feedback, checkeval, interacteval";

/// The domain corpus preset of a wire value; unknown, unspecified and instance-level values are
/// violations of `field`.
pub fn corpus_preset_from(value: i32, field: &str) -> Result<CorpusPreset, FieldViolation> {
    let p = pb::Preset::try_from(value).map_err(|_| {
        FieldViolation::new(field, format!("unknown enum value {value} (corpus presets: {CORPUS_PRESETS})"))
    })?;
    match p {
        pb::Preset::Unspecified => {
            Err(FieldViolation::new(field, format!("is required (corpus presets: {CORPUS_PRESETS})")))
        }
        pb::Preset::Tick
        | pb::Preset::Rocketeval
        | pb::Preset::RlcfDirect
        | pb::Preset::RlcfCandidate
        | pb::Preset::RlcfCandidatesOnly
        | pb::Preset::OpenrubricsPairwise
        | pb::Preset::OpenrubricsListwise => Err(FieldViolation::new(
            field,
            format!("{} is an instance-level preset: use Generate (corpus presets: {CORPUS_PRESETS})", p.as_str_name()),
        )),
        pb::Preset::Feedback => Ok(CorpusPreset::Feedback),
        pb::Preset::Checkeval => Ok(CorpusPreset::CheckEval),
        pb::Preset::Interacteval => Ok(CorpusPreset::InteractEval),
    }
}

/// The wire value of a domain corpus preset.
pub fn corpus_preset_to(p: CorpusPreset) -> pb::Preset {
    match p {
        CorpusPreset::Feedback => pb::Preset::Feedback,
        CorpusPreset::CheckEval => pb::Preset::Checkeval,
        CorpusPreset::InteractEval => pb::Preset::Interacteval,
    }
}

/// Any preset of a wire value (instance or corpus level).
pub fn preset_id_from(value: i32, field: &str) -> Result<PresetId, FieldViolation> {
    match corpus_preset_from(value, field) {
        Ok(p) => Ok(PresetId::Corpus(p)),
        Err(_) => preset_from(value, field).map(PresetId::Instance),
    }
}

/// The wire value of any preset.
pub fn preset_id_to(p: PresetId) -> pb::Preset {
    match p {
        PresetId::Instance(p) => preset_to(p),
        PresetId::Corpus(p) => corpus_preset_to(p),
    }
}

fn candidate_from(c: pb::Candidate) -> Candidate {
    let pb::Candidate { id, text, model } = c;
    Candidate { id, text, model }
}

fn candidate_to(c: &Candidate) -> pb::Candidate {
    pb::Candidate { id: c.id.clone(), text: c.text.clone(), model: c.model.clone() }
}

/// Generate request from the wire. Wire-level checks here (enum values, model specs); the core's
/// [`Generator::validate`](crate::Generator::validate) checks required fields and limits.
pub fn generate_request(p: pb::GenerateRequest) -> Result<GenerateRequest, StageError> {
    let pb::GenerateRequest {
        preset,
        input,
        reference,
        history,
        candidates,
        chosen,
        rejected,
        max_items,
        model,
        candidate_models,
    } = p;
    let mut v = Violations::new();
    let preset = match preset_from(preset, "preset") {
        Ok(p) => Some(p),
        Err(f) => {
            v.push(f.field, f.description);
            None
        }
    };
    let model = convert::model_spec(model, "model", &mut v);
    let candidate_models = candidate_models
        .into_iter()
        .enumerate()
        .map(|(i, m)| convert::model_spec(Some(m), &format!("candidate_models[{i}]"), &mut v))
        .collect();
    v.into_result()?;
    let preset = preset.ok_or_else(|| StageError::Internal("preset missing after validation".into()))?;
    Ok(GenerateRequest {
        preset,
        input,
        reference,
        history,
        candidates: candidates.into_iter().map(candidate_from).collect(),
        chosen,
        rejected,
        max_items,
        model,
        candidate_models,
    })
}

/// A responder's request from the wire (fields named as in `RespondRequest`).
pub fn respond_request(p: pb::RespondRequest) -> Result<RespondRequest, StageError> {
    let pb::RespondRequest { model, system_prompt, prompt, samples } = p;
    let mut v = Violations::new();
    let model = convert::model_spec(model, "model", &mut v);
    v.into_result()?;
    let r = RespondRequest { model, system_prompt, prompt, samples };
    r.validate()?;
    Ok(r)
}

/// A responder's request to the wire (for remote callers).
pub fn respond_request_to(r: &RespondRequest) -> pb::RespondRequest {
    pb::RespondRequest {
        model: Some(convert::model_spec_to(&r.model)),
        system_prompt: r.system_prompt.clone(),
        prompt: r.prompt.clone(),
        samples: r.samples,
    }
}

/// A responder's outcome to the wire (Respond's last event).
pub fn respond_done_to(o: &RespondOutcome) -> pb::RespondDone {
    pb::RespondDone {
        responses: o.responses.clone(),
        usage: Some(convert::usage_to(&o.usage)),
        model: Some(convert::model_record_to(&o.model)),
    }
}

/// A responder's outcome from the wire (for remote callers).
pub fn respond_done_from(p: pb::RespondDone) -> RespondOutcome {
    RespondOutcome {
        responses: p.responses,
        usage: convert::usage_from(p.usage),
        model: convert::model_record_from(p.model),
    }
}

/// Generate request to the wire (for remote callers).
pub fn generate_request_to(r: &GenerateRequest) -> pb::GenerateRequest {
    pb::GenerateRequest {
        preset: preset_to(r.preset) as i32,
        input: r.input.clone(),
        reference: r.reference.clone(),
        history: r.history.clone(),
        candidates: r.candidates.iter().map(candidate_to).collect(),
        chosen: r.chosen.clone(),
        rejected: r.rejected.clone(),
        max_items: r.max_items,
        model: Some(convert::model_spec_to(&r.model)),
        candidate_models: r.candidate_models.iter().map(convert::model_spec_to).collect(),
    }
}

/// Generate response to the wire.
pub fn generate_response_to(o: &GenerateOutcome) -> pb::GenerateResponse {
    pb::GenerateResponse {
        checklist: Some(convert::checklist_to(&o.checklist)),
        dropped_items: o.dropped_items,
        default_scorer: Some(convert::scorer_config_to(&o.default_scorer)),
        candidates: o.candidates.iter().map(candidate_to).collect(),
        usage: Some(convert::usage_to(&o.usage)),
        model: Some(convert::model_record_to(&o.model)),
    }
}

/// Generate response from the wire (for remote callers). A response that breaks the checklist
/// rules (no checklist, empty or duplicate items) is an INTERNAL error of the remote stage.
pub fn generate_response_from(p: pb::GenerateResponse) -> Result<GenerateOutcome, StageError> {
    let pb::GenerateResponse { checklist, dropped_items, default_scorer, candidates, usage, model } = p;
    let mut v = Violations::new();
    let checklist = convert::checklist(checklist, "checklist", &mut v);
    let default_scorer = convert::scorer_config(default_scorer, "default_scorer", &mut v)
        .resolve(&assay_domain::ScorerConfig::default());
    v.into_result().map_err(|e| StageError::Internal(format!("the generator sent an invalid response: {e}")))?;
    Ok(GenerateOutcome {
        checklist,
        dropped_items,
        default_scorer,
        candidates: candidates.into_iter().map(candidate_from).collect(),
        usage: convert::usage_from(usage),
        model: convert::model_record_from(model),
    })
}

/// Preset defaults to the wire.
pub fn preset_info_to(i: &PresetInfo) -> pb::PresetInfo {
    pb::PresetInfo {
        preset: preset_id_to(i.preset) as i32,
        name: i.name.clone(),
        level: match i.level {
            GenerationLevel::Instance => common::GenerationLevel::Instance,
            GenerationLevel::Corpus => common::GenerationLevel::Corpus,
        } as i32,
        required_fields: i.required_fields.clone(),
        default_max_items: i.default_max_items,
        default_temperature: i.default_temperature,
        default_scorer: Some(convert::scorer_config_to(&i.default_scorer)),
    }
}

/// Preset defaults from the wire; entries with an unknown preset are skipped.
pub fn preset_infos_from(p: pb::ListPresetsResponse) -> Vec<PresetInfo> {
    p.presets
        .into_iter()
        .filter_map(|i| {
            let pb::PresetInfo {
                preset,
                name,
                level,
                required_fields,
                default_max_items,
                default_temperature,
                default_scorer,
            } = i;
            let preset = preset_id_from(preset, "preset").ok()?;
            let mut v = Violations::new();
            let default_scorer = convert::scorer_config(default_scorer, "default_scorer", &mut v)
                .resolve(&assay_domain::ScorerConfig::default());
            Some(PresetInfo {
                preset,
                name,
                level: match common::GenerationLevel::try_from(level) {
                    Ok(common::GenerationLevel::Corpus) => GenerationLevel::Corpus,
                    Ok(common::GenerationLevel::Instance | common::GenerationLevel::Unspecified) | Err(_) => {
                        GenerationLevel::Instance
                    }
                },
                required_fields,
                default_max_items,
                default_temperature,
                default_scorer,
            })
        })
        .collect()
}

fn augmentation_from(value: i32, field: &str, v: &mut Violations) -> AugmentationMode {
    match pb::AugmentationMode::try_from(value) {
        Ok(pb::AugmentationMode::Unspecified | pb::AugmentationMode::Seed) => AugmentationMode::Seed,
        Ok(pb::AugmentationMode::Elaboration) => AugmentationMode::Elaboration,
        Ok(pb::AugmentationMode::Diversification) => AugmentationMode::Diversification,
        Ok(pb::AugmentationMode::Combined) => AugmentationMode::Combined,
        Err(_) => {
            v.push(field, format!("unknown enum value {value} (allowed: 0-4)"));
            AugmentationMode::Seed
        }
    }
}

/// The wire value of an augmentation mode.
pub fn augmentation_to(m: AugmentationMode) -> pb::AugmentationMode {
    match m {
        AugmentationMode::Seed => pb::AugmentationMode::Seed,
        AugmentationMode::Elaboration => pb::AugmentationMode::Elaboration,
        AugmentationMode::Diversification => pb::AugmentationMode::Diversification,
        AugmentationMode::Combined => pb::AugmentationMode::Combined,
    }
}

fn dimension_from(d: pb::Dimension) -> Dimension {
    let pb::Dimension { name, definition, sub_dimensions } = d;
    Dimension {
        name,
        definition,
        sub_dimensions: sub_dimensions
            .into_iter()
            .map(|s| {
                let pb::SubDimension { name, definition } = s;
                SubDimension { name, definition }
            })
            .collect(),
    }
}

fn dimension_to(d: &Dimension) -> pb::Dimension {
    pb::Dimension {
        name: d.name.clone(),
        definition: d.definition.clone(),
        sub_dimensions: d
            .sub_dimensions
            .iter()
            .map(|s| pb::SubDimension { name: s.name.clone(), definition: s.definition.clone() })
            .collect(),
    }
}

fn refinement_from(r: Option<pb::CorpusRefinement>) -> CorpusRefinement {
    let Some(pb::CorpusRefinement {
        skip_deduplication,
        skip_tagging,
        run_unit_tester,
        skip_selection,
        dedup_threshold,
        max_questions,
        beam_width,
        length_penalty,
        alpha,
        unit_test_samples,
    }) = r
    else {
        return CorpusRefinement::default();
    };
    CorpusRefinement {
        skip_deduplication,
        skip_tagging,
        run_unit_tester,
        skip_selection,
        dedup_threshold,
        max_questions,
        beam_width,
        length_penalty,
        alpha,
        unit_test_samples,
    }
}

fn refinement_to(r: &CorpusRefinement) -> pb::CorpusRefinement {
    pb::CorpusRefinement {
        skip_deduplication: r.skip_deduplication,
        skip_tagging: r.skip_tagging,
        run_unit_tester: r.run_unit_tester,
        skip_selection: r.skip_selection,
        dedup_threshold: r.dedup_threshold,
        max_questions: r.max_questions,
        beam_width: r.beam_width,
        length_penalty: r.length_penalty,
        alpha: r.alpha,
        unit_test_samples: r.unit_test_samples.clone(),
    }
}

/// Corpus request from the wire. Wire-level checks here (enum values, model specs); the core's
/// [`validate`](crate::core::corpus::validate) checks required fields, ranges and limits.
pub fn corpus_request(p: pb::GenerateCorpusRequest) -> Result<CorpusRequest, StageError> {
    let pb::GenerateCorpusRequest {
        preset,
        corpus_description,
        observations,
        batch_size,
        dimensions,
        augmentation,
        filter,
        refinement,
        model,
        embedding_model,
        concurrency,
    } = p;
    let mut v = Violations::new();
    let preset = match corpus_preset_from(preset, "preset") {
        Ok(p) => Some(p),
        Err(f) => {
            v.push(f.field, f.description);
            None
        }
    };
    let augmentation = augmentation_from(augmentation, "augmentation", &mut v);
    let model = convert::model_spec(model, "model", &mut v);
    let embedding_model = convert::model_spec(embedding_model, "embedding_model", &mut v);
    v.into_result()?;
    let preset = preset.ok_or_else(|| StageError::Internal("preset missing after validation".into()))?;
    Ok(CorpusRequest {
        preset,
        corpus_description,
        observations,
        batch_size,
        dimensions: dimensions.into_iter().map(dimension_from).collect(),
        augmentation,
        filter,
        refinement: refinement_from(refinement),
        model,
        embedding_model,
        concurrency: (concurrency > 0).then_some(concurrency),
    })
}

/// Corpus request to the wire (for remote callers).
pub fn corpus_request_to(r: &CorpusRequest) -> pb::GenerateCorpusRequest {
    pb::GenerateCorpusRequest {
        preset: corpus_preset_to(r.preset) as i32,
        corpus_description: r.corpus_description.clone(),
        observations: r.observations.clone(),
        batch_size: r.batch_size,
        dimensions: r.dimensions.iter().map(dimension_to).collect(),
        augmentation: augmentation_to(r.augmentation) as i32,
        filter: r.filter,
        refinement: Some(refinement_to(&r.refinement)),
        model: Some(convert::model_spec_to(&r.model)),
        embedding_model: Some(convert::model_spec_to(&r.embedding_model)),
        concurrency: r.concurrency.unwrap_or(0),
    }
}

/// Corpus response to the wire.
pub fn corpus_response_to(o: &CorpusOutcome) -> pb::GenerateCorpusResponse {
    pb::GenerateCorpusResponse {
        checklist: Some(convert::checklist_to(&o.checklist)),
        raw_questions: o.raw_questions,
        usage: Some(convert::usage_to(&o.usage)),
        model: Some(convert::model_record_to(&o.model)),
    }
}

/// Corpus response from the wire (for remote callers); a response breaking the checklist rules is
/// an INTERNAL error of the remote stage.
pub fn corpus_response_from(p: pb::GenerateCorpusResponse) -> Result<CorpusOutcome, StageError> {
    let pb::GenerateCorpusResponse { checklist, raw_questions, usage, model } = p;
    let mut v = Violations::new();
    let checklist = convert::checklist(checklist, "checklist", &mut v);
    v.into_result().map_err(|e| StageError::Internal(format!("the generator sent an invalid response: {e}")))?;
    Ok(CorpusOutcome {
        checklist,
        raw_questions,
        usage: convert::usage_from(usage),
        model: convert::model_record_from(model),
    })
}

/// A progress event to the wire.
pub fn progress_to(e: &CorpusProgress) -> common::Progress {
    common::Progress { stage: e.stage.clone(), message: e.message.clone(), done: e.done, total: e.total }
}

/// A progress event from the wire.
pub fn progress_from(p: common::Progress) -> CorpusProgress {
    let common::Progress { stage, message, done, total } = p;
    CorpusProgress { stage, message, done, total }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(e: StageError) -> Vec<(String, String)> {
        let StageError::InvalidArgument(v) = e else { panic!("not invalid argument: {e}") };
        v.into_iter().map(|f| (f.field, f.description)).collect()
    }

    #[test]
    fn preset_values_are_checked() {
        for (value, text) in [
            (0, "is required"),
            (99, "unknown enum value 99"),
            (pb::Preset::Feedback as i32, "use GenerateCorpus"),
            (pb::Preset::Checkeval as i32, "use GenerateCorpus"),
        ] {
            let e = generate_request(pb::GenerateRequest { preset: value, ..Default::default() }).unwrap_err();
            let f = field_of(e);
            assert_eq!(f.len(), 1);
            assert_eq!(f[0].0, "preset");
            assert!(f[0].1.contains(text), "{value}: {}", f[0].1);
        }
    }

    #[test]
    fn presets_round_trip() {
        for p in Preset::ALL {
            assert_eq!(preset_from(preset_to(p) as i32, "preset").unwrap(), p);
        }
    }

    #[test]
    fn bad_model_specs_name_their_field() {
        let e = generate_request(pb::GenerateRequest {
            preset: pb::Preset::Tick as i32,
            candidate_models: vec![
                common::ModelSpec::default(),
                common::ModelSpec { temperature: Some(3.0), ..Default::default() },
            ],
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(field_of(e)[0].0, "candidate_models[1].temperature");
    }

    #[test]
    fn corpus_presets_are_checked() {
        for (value, text) in [
            (0, "is required"),
            (99, "unknown enum value 99"),
            (pb::Preset::Tick as i32, "use Generate"),
            (pb::Preset::OpenrubricsListwise as i32, "use Generate"),
        ] {
            let e = corpus_request(pb::GenerateCorpusRequest { preset: value, ..Default::default() }).unwrap_err();
            let f = field_of(e);
            assert_eq!(f.len(), 1);
            assert_eq!(f[0].0, "preset");
            assert!(f[0].1.contains(text), "{value}: {}", f[0].1);
        }
        for p in CorpusPreset::ALL {
            assert_eq!(corpus_preset_from(corpus_preset_to(p) as i32, "preset").unwrap(), p);
            assert_eq!(preset_id_from(corpus_preset_to(p) as i32, "preset").unwrap(), PresetId::Corpus(p));
        }
        assert_eq!(preset_id_from(pb::Preset::Tick as i32, "preset").unwrap(), PresetId::Instance(Preset::Tick));
    }

    #[test]
    fn corpus_request_round_trips() {
        let mut r = CorpusRequest::new(CorpusPreset::CheckEval);
        r.corpus_description = "summaries".into();
        r.dimensions = vec![Dimension {
            name: "coherence".into(),
            definition: "d".into(),
            sub_dimensions: vec![SubDimension { name: "flow".into(), definition: "f".into() }],
        }];
        r.augmentation = AugmentationMode::Combined;
        r.filter = true;
        r.batch_size = Some(10);
        r.refinement = CorpusRefinement {
            skip_deduplication: true,
            skip_tagging: true,
            run_unit_tester: false,
            skip_selection: true,
            dedup_threshold: Some(0.9),
            max_questions: Some(12),
            beam_width: Some(3),
            length_penalty: Some(0.001),
            alpha: Some(0.25),
            unit_test_samples: vec!["a sample".into()],
        };
        r.model.temperature = Some(0.2);
        r.embedding_model.model = Some("emb".into());
        r.concurrency = Some(3);
        assert_eq!(corpus_request(corpus_request_to(&r)).unwrap(), r);
        // Unset wire values take the domain defaults.
        let d = corpus_request(pb::GenerateCorpusRequest { preset: pb::Preset::Feedback as i32, ..Default::default() })
            .unwrap();
        assert_eq!(d, CorpusRequest::new(CorpusPreset::Feedback));
    }

    #[test]
    fn request_round_trips() {
        let mut r = GenerateRequest::new(Preset::RlcfCandidate, "in");
        r.reference = "ref".into();
        r.candidates = vec![Candidate { id: "a".into(), text: "t".into(), model: "m".into() }];
        r.max_items = Some(3);
        r.model.temperature = Some(0.5);
        r.candidate_models = vec![assay_domain::ModelSpec { model: Some("small".into()), ..Default::default() }];
        assert_eq!(generate_request(generate_request_to(&r)).unwrap(), r);
    }
}
