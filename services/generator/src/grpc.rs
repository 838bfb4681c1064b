//! gRPC adapter: convert the request (exhaustive destructuring, enum checks), call the core, map
//! the result. The conversions are public so the gateway's remote client can reuse them.

use std::pin::Pin;
use std::sync::Arc;

use assay_domain::{FieldViolation, GenerationLevel, StageError, Violations};
use assay_proto::common::v1 as common;
use assay_proto::convert;
use assay_proto::generator::v1 as pb;
use assay_proto::generator::v1::generator_service_server::{GeneratorService, GeneratorServiceServer};
use assay_rpc::{CallContext, run_with, to_status};
use futures::Stream;
use tonic::service::Routes;
use tonic::{Request, Response, Status};

use crate::core::{Candidate, ChecklistGenerator, GenerateOutcome, GenerateRequest, Preset, PresetInfo};

/// The generator's gRPC face over any [`ChecklistGenerator`].
#[derive(Clone)]
pub struct GeneratorGrpc {
    core: Arc<dyn ChecklistGenerator>,
}

impl GeneratorGrpc {
    pub fn new(core: Arc<dyn ChecklistGenerator>) -> Self {
        Self { core }
    }
}

/// Routes serving the generator, with Assay's message limits. Pass `Arc::new(Generator::new(hub))`
/// (or any other [`ChecklistGenerator`]).
pub fn routes(core: Arc<dyn ChecklistGenerator>) -> Routes {
    Routes::new(
        GeneratorServiceServer::new(GeneratorGrpc::new(core))
            .max_decoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES),
    )
}

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
    let default_scorer = convert::scorer_config(default_scorer, "default_scorer", &mut v);
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
        preset: preset_to(i.preset) as i32,
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

/// Preset defaults from the wire; entries whose preset is not instance-level are skipped.
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
            let preset = preset_from(preset, "preset").ok()?;
            let mut v = Violations::new();
            let default_scorer = convert::scorer_config(default_scorer, "default_scorer", &mut v);
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

fn corpus_not_yet(rpc: &str) -> Status {
    Status::unimplemented(format!(
        "{rpc} is not available yet: corpus-level generation (feedback, checkeval, interacteval) is not built \
         in this release; instance-level Generate works"
    ))
}

type EventStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl GeneratorService for GeneratorGrpc {
    async fn generate(&self, request: Request<pb::GenerateRequest>) -> Result<Response<pb::GenerateResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let req = generate_request(request.into_inner()).map_err(to_status)?;
        let core = self.core.clone();
        let out = run_with(ctx, async move { core.generate(req).await }).await.map_err(to_status)?;
        Ok(Response::new(generate_response_to(&out)))
    }

    async fn generate_corpus(
        &self,
        _: Request<pb::GenerateCorpusRequest>,
    ) -> Result<Response<pb::GenerateCorpusResponse>, Status> {
        Err(corpus_not_yet("GenerateCorpus"))
    }

    type GenerateCorpusStreamStream = EventStream<pb::GenerateCorpusStreamResponse>;

    async fn generate_corpus_stream(
        &self,
        _: Request<pb::GenerateCorpusStreamRequest>,
    ) -> Result<Response<Self::GenerateCorpusStreamStream>, Status> {
        Err(corpus_not_yet("GenerateCorpusStream"))
    }

    async fn list_presets(
        &self,
        request: Request<pb::ListPresetsRequest>,
    ) -> Result<Response<pb::ListPresetsResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let pb::ListPresetsRequest {} = request.into_inner();
        let core = self.core.clone();
        let presets = run_with(ctx, async move { core.list_presets().await }).await.map_err(to_status)?;
        Ok(Response::new(pb::ListPresetsResponse { presets: presets.iter().map(preset_info_to).collect() }))
    }
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
