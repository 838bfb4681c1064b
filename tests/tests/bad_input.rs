//! A table of malformed requests across every RPC of every service, sent over the whole mesh on
//! loopback: empty, oversized, NaN and infinite, negative and out-of-range numbers, unknown enum
//! values, invalid UTF-8 inside string fields (encoded by hand), control characters, duplicate ids
//! and unknown run ids. Each must come back INVALID_ARGUMENT naming the field in its BadRequest
//! details (NOT_FOUND naming the run for unknown run ids), with no model call and no panic; every
//! service is still SERVING at the end.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, Once, PoisonError};
use std::time::Duration;

use assay_proto::arbiter::v1 as ar;
use assay_proto::arbiter::v1::arbiter_service_client::ArbiterServiceClient;
use assay_proto::common::v1 as pb;
use assay_proto::debate::v1 as db;
use assay_proto::debate::v1::debate_service_client::DebateServiceClient;
use assay_proto::delta_judge::v1 as dj;
use assay_proto::delta_judge::v1::delta_judge_service_client::DeltaJudgeServiceClient;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_proto::gateway::v1::run_pipeline_request::Pipeline;
use assay_proto::generator::v1 as gn;
use assay_proto::generator::v1::generator_service_client::GeneratorServiceClient;
use assay_proto::refiners::v1 as rf;
use assay_proto::refiners::v1::refiners_service_client::RefinersServiceClient;
use assay_proto::scorer::v1 as sc;
use assay_proto::scorer::v1::scorer_service_client::ScorerServiceClient;
use assay_tests::MeshSandbox;
use bytes::{Buf, BufMut};
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_types::StatusExt;

/// What one case sends wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// A required field or list left empty (or a required message unset).
    Empty,
    /// Over a documented size or count limit.
    Huge,
    Nan,
    Infinite,
    Negative,
    /// A number outside its documented range (zero where at least one is needed, too large).
    OutOfRange,
    /// An i32 that is not a value of the field's enum.
    UnknownEnum,
    /// A string field whose bytes are not UTF-8 (the message encoded by hand).
    InvalidUtf8,
    /// Control characters where they are refused (blank-only text, names, tokens).
    ControlChars,
    DuplicateId,
    UnknownRunId,
}

type Outcome = Result<(), Status>;
type Call = Pin<Box<dyn Future<Output = Outcome> + Send>>;

/// What a case must get back.
struct Expect {
    rpc: &'static str,
    kind: Kind,
    code: Code,
    /// The field a BadRequest violation must name (exactly, and the message too), or for NOT_FOUND
    /// a text the message must contain.
    field: String,
}

struct Case {
    expect: Expect,
    call: Call,
}

#[derive(Default)]
struct Table {
    cases: Vec<Case>,
}

impl Table {
    fn invalid(&mut self, rpc: &'static str, kind: Kind, field: impl Into<String>, call: Call) {
        self.cases.push(Case { expect: Expect { rpc, kind, code: Code::InvalidArgument, field: field.into() }, call });
    }

    fn not_found(&mut self, rpc: &'static str, kind: Kind, text: impl Into<String>, call: Call) {
        self.cases.push(Case { expect: Expect { rpc, kind, code: Code::NotFound, field: text.into() }, call });
    }
}

/// A unary call: `Ok(())` when the service accepted the request.
macro_rules! unary {
    ($client:expr, $method:ident, $request:expr) => {{
        let mut client = $client.clone();
        let request = $request;
        Box::pin(async move { client.$method(request).await.map(drop) }) as Call
    }};
}

/// A server-streaming call: refused at the call, or by the first item of the stream.
macro_rules! streaming {
    ($client:expr, $method:ident, $request:expr) => {{
        let mut client = $client.clone();
        let request = $request;
        Box::pin(async move { client.$method(request).await?.into_inner().message().await.map(drop) }) as Call
    }};
}

// ---------------------------------------------------------------------------------------------
// Hand-encoded messages: invalid UTF-8 inside a string field, garbage bytes.

/// Passes encoded bytes through as they are.
#[derive(Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }
    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

/// Marks the string field to corrupt; replaced byte for byte, so every length stays right.
const MARK: &str = "@@not-utf-8@@";

/// `message` encoded, with the bytes of [`MARK`] replaced by 0xFF (never valid UTF-8).
fn corrupt(message: &impl Message) -> Vec<u8> {
    let mut bytes = message.encode_to_vec();
    let at = bytes.windows(MARK.len()).position(|w| w == MARK.as_bytes()).expect("the message holds the marker");
    bytes[at..at + MARK.len()].fill(0xFF);
    bytes
}

/// Send `body` as the request of `path` (unary, or server-streaming reading the first item).
fn raw(channel: &Channel, path: &'static str, body: Vec<u8>, streaming: bool) -> Call {
    let channel = channel.clone();
    Box::pin(async move {
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.map_err(|e| Status::unavailable(e.to_string()))?;
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(path);
        if streaming {
            grpc.server_streaming(tonic::Request::new(body), path, RawCodec)
                .await?
                .into_inner()
                .message()
                .await
                .map(drop)
        } else {
            grpc.unary(tonic::Request::new(body), path, RawCodec).await.map(drop)
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Valid requests, broken one field at a time.

/// Whitespace that is all control characters (tab, line feed, vertical tab, form feed, carriage
/// return, next line): blank text.
const CONTROL_BLANK: &str = "\t\n\u{b}\u{c}\r\u{85}";
/// A backend name no configuration has.
const CONTROL_BACKEND: &str = "open\u{0}ai\u{1b}[31m";

fn huge_text() -> String {
    "x".repeat(assay_domain::limits::MAX_TEXT_BYTES + 1)
}

fn item(id: &str, question: &str) -> pb::ChecklistItem {
    pb::ChecklistItem { id: id.into(), question: question.into(), weight: Some(50.0), ..Default::default() }
}

fn items() -> Vec<pb::ChecklistItem> {
    vec![item("lines", "Is it three lines?"), item("topic", "Is it about autumn?")]
}

fn checklist() -> pb::Checklist {
    pb::Checklist { id: "haiku".into(), items: items(), ..Default::default() }
}

fn eval_pipeline() -> gw::ChecklistEvalPipeline {
    gw::ChecklistEvalPipeline {
        source: Some(gw::ChecklistSource { source: Some(gw::checklist_source::Source::Checklist(checklist())) }),
        records: vec![gw::EvalRecord { id: "r0".into(), target: "red leaves fall".into(), ..Default::default() }],
        ..Default::default()
    }
}

fn evaluate(f: impl FnOnce(&mut gw::ChecklistEvalPipeline)) -> gw::EvaluateRequest {
    let mut p = eval_pipeline();
    f(&mut p);
    gw::EvaluateRequest { pipeline: Some(p), budget: None }
}

fn run(pipeline: Pipeline) -> gw::RunPipelineRequest {
    gw::RunPipelineRequest { open: false, pipeline: Some(pipeline), label: "bad input".into(), budget: None }
}

fn items_of(p: &mut gw::ChecklistEvalPipeline) -> &mut Vec<pb::ChecklistItem> {
    match p.source.as_mut().and_then(|s| s.source.as_mut()) {
        Some(gw::checklist_source::Source::Checklist(c)) => &mut c.items,
        _ => panic!("explicit checklist"),
    }
}

fn generate_checklist(f: impl FnOnce(&mut gw::GenerateChecklistPipeline)) -> gw::RunPipelineRequest {
    let mut p = gw::GenerateChecklistPipeline {
        source: Some(gw::ChecklistSource {
            source: Some(gw::checklist_source::Source::Preset(gn::Preset::Tick as i32)),
        }),
        record: Some(gw::EvalRecord { input: "Write a haiku about autumn.".into(), ..Default::default() }),
        ..Default::default()
    };
    f(&mut p);
    run(Pipeline::GenerateChecklist(p))
}

fn sections() -> Vec<pb::Section> {
    vec![
        pb::Section {
            id: "intro".into(),
            index: 0,
            title: "Intro".into(),
            content: "A funnel has four stages.".into(),
        },
        pb::Section { id: "stages".into(), index: 1, title: "Stages".into(), content: "Awareness comes last.".into() },
    ]
}

fn verdict(judge: &str) -> pb::JudgeVerdict {
    pb::JudgeVerdict {
        judge_id: judge.into(),
        criterion_scores: [("clarity_readability".to_string(), 0.5)].into_iter().collect(),
        overall_score: 0.5,
        ..Default::default()
    }
}

fn issue(section: &str) -> pb::JudgeIssue {
    pb::JudgeIssue {
        id: "i1".into(),
        criterion: "factual_accuracy".into(),
        severity: pb::Severity::Major as i32,
        section_id: section.into(),
        description: "The order is wrong".into(),
        fix_instruction: "Put awareness first.".into(),
        ..Default::default()
    }
}

fn targeted(f: impl FnOnce(&mut gw::TargetedRefinementPipeline)) -> gw::RunPipelineRequest {
    let mut p = gw::TargetedRefinementPipeline { sections: sections(), ..Default::default() };
    f(&mut p);
    run(Pipeline::TargetedRefinement(p))
}

fn draft() -> rf::SelfRefineRequest {
    rf::SelfRefineRequest { draft: "A draft that is long enough to refine. ".repeat(8), ..Default::default() }
}

fn self_refine_run(f: impl FnOnce(&mut rf::SelfRefineRequest)) -> gw::RunPipelineRequest {
    let mut r = draft();
    f(&mut r);
    run(Pipeline::SelfRefine(gw::SelfRefinePipeline { request: Some(r) }))
}

fn debate_run(f: impl FnOnce(&mut gw::DebatePipeline)) -> gw::RunPipelineRequest {
    let mut p = gw::DebatePipeline {
        problems: vec![gw::DebateProblem { id: "p1".into(), problem: "What is 2 + 2?".into(), reference: None }],
        ..Default::default()
    };
    f(&mut p);
    run(Pipeline::Debate(p))
}

fn spec(f: impl FnOnce(&mut pb::ModelSpec)) -> Option<pb::ModelSpec> {
    let mut s = pb::ModelSpec::default();
    f(&mut s);
    Some(s)
}

fn solvers() -> Vec<db::Solver> {
    ["s1", "s2", "s3"].iter().map(|id| db::Solver { id: (*id).into(), ..Default::default() }).collect()
}

fn solutions() -> Vec<db::Solution> {
    ["s1", "s2", "s3"]
        .iter()
        .map(|id| db::Solution {
            solver_id: (*id).into(),
            final_answer: "4".into(),
            confidence: 0.5,
            ..Default::default()
        })
        .collect()
}

fn reviews() -> Vec<db::Review> {
    let ids = ["s1", "s2", "s3"];
    ids.iter()
        .flat_map(|r| {
            ids.iter().filter(move |t| *t != r).map(move |t| db::Review {
                reviewer_id: (*r).into(),
                target_solver_id: (*t).into(),
                strengths: vec!["clear".into()],
                ..Default::default()
            })
        })
        .collect()
}

fn refined() -> Vec<db::RefinedSolution> {
    ["s1", "s2", "s3"]
        .iter()
        .map(|id| db::RefinedSolution {
            solver_id: (*id).into(),
            final_answer: "4".into(),
            confidence: 0.6,
            ..Default::default()
        })
        .collect()
}

fn locks_request(f: impl FnOnce(&mut dj::CheckQualityLocksRequest)) -> dj::CheckQualityLocksRequest {
    let mut r = dj::CheckQualityLocksRequest {
        locks: vec![dj::QualityLock { criterion: "clarity".into(), baseline: 0.8, max_drop: None }],
        criterion_scores: [("clarity".to_string(), 0.8)].into_iter().collect(),
    };
    f(&mut r);
    r
}

fn verify_request(f: impl FnOnce(&mut dj::VerifyRequest)) -> dj::VerifyRequest {
    let mut r = dj::VerifyRequest {
        before: Some(sections()[1].clone()),
        after: Some(pb::Section { content: "Awareness comes first.".into(), ..sections()[1].clone() }),
        issues: vec![issue("stages")],
        ..Default::default()
    };
    f(&mut r);
    r
}

fn patch(f: impl FnOnce(&mut rf::PatchRequest)) -> rf::PatchRequest {
    let mut r = rf::PatchRequest {
        section: Some(sections()[1].clone()),
        instruction: "Put awareness first.".into(),
        ..Default::default()
    };
    f(&mut r);
    r
}

fn expand(f: impl FnOnce(&mut rf::ExpandSectionRequest)) -> rf::ExpandSectionRequest {
    let mut r = rf::ExpandSectionRequest {
        section: Some(sections()[1].clone()),
        instruction: "Explain every stage.".into(),
        ..Default::default()
    };
    f(&mut r);
    r
}

fn score(f: impl FnOnce(&mut sc::ScoreRequest)) -> sc::ScoreRequest {
    let mut r = sc::ScoreRequest {
        checklist: Some(checklist()),
        targets: vec![sc::ScoreTarget { target: "red leaves fall".into(), ..Default::default() }],
        ..Default::default()
    };
    f(&mut r);
    r
}

fn judge_sections(f: impl FnOnce(&mut sc::JudgeSectionsRequest)) -> sc::JudgeSectionsRequest {
    let mut r = sc::JudgeSectionsRequest { sections: sections(), ..Default::default() };
    f(&mut r);
    r
}

fn consolidate(f: impl FnOnce(&mut ar::ConsolidateRequest)) -> ar::ConsolidateRequest {
    let mut r = ar::ConsolidateRequest {
        verdicts: vec![verdict("j1"), verdict("j2")],
        sections: sections(),
        skip_synthesis: true,
        ..Default::default()
    };
    f(&mut r);
    r
}

fn route(f: impl FnOnce(&mut ar::RouteRequest)) -> ar::RouteRequest {
    let mut r = ar::RouteRequest { issues: vec![issue("stages")], sections: sections(), ..Default::default() };
    f(&mut r);
    r
}

fn plan(f: impl FnOnce(&mut ar::PlanRequest)) -> ar::PlanRequest {
    let mut r = ar::PlanRequest {
        verdicts: vec![verdict("j1"), verdict("j2")],
        sections: sections(),
        skip_synthesis: true,
        ..Default::default()
    };
    f(&mut r);
    r
}

fn generate(f: impl FnOnce(&mut gn::GenerateRequest)) -> gn::GenerateRequest {
    let mut r = gn::GenerateRequest {
        preset: gn::Preset::Tick as i32,
        input: "Write a haiku about autumn.".into(),
        ..Default::default()
    };
    f(&mut r);
    r
}

fn corpus(f: impl FnOnce(&mut gn::GenerateCorpusRequest)) -> gn::GenerateCorpusRequest {
    let mut r = gn::GenerateCorpusRequest {
        preset: gn::Preset::Feedback as i32,
        corpus_description: "Feedback on short poems".into(),
        observations: vec!["Too long.".into(), "Rhymes feel forced.".into()],
        ..Default::default()
    };
    f(&mut r);
    r
}

fn dimension(name: &str) -> gn::Dimension {
    gn::Dimension { name: name.into(), definition: "How well it reads".into(), sub_dimensions: vec![] }
}

fn unit_test(f: impl FnOnce(&mut rf::UnitTestRequest)) -> rf::UnitTestRequest {
    let mut r = rf::UnitTestRequest {
        items: items(),
        samples: vec![rf::Sample {
            id: "s1".into(),
            text: "red leaves fall".into(),
            answers: [("lines".to_string(), pb::Answer::Yes as i32)].into_iter().collect(),
        }],
        input: "Write a haiku about autumn.".into(),
        ..Default::default()
    };
    f(&mut r);
    r
}

fn run_debate(f: impl FnOnce(&mut db::RunDebateRequest)) -> db::RunDebateRequest {
    let mut r = db::RunDebateRequest { problem: "What is 2 + 2?".into(), ..Default::default() };
    f(&mut r);
    r
}

// ---------------------------------------------------------------------------------------------

/// Panics anywhere in this process (every service of the mesh runs in it).
static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Record every panic in [`PANICS`], then report it as usual.
fn count_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.lock().unwrap_or_else(PoisonError::into_inner).push(info.to_string());
            previous(info);
        }));
    });
}

fn panics() -> Vec<String> {
    PANICS.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

#[allow(clippy::too_many_lines)]
fn table(ch: &Channels) -> Table {
    use Kind::*;
    let mut t = Table::default();
    let gateway = GatewayServiceClient::new(ch.gateway.clone());
    let generator = GeneratorServiceClient::new(ch.generator.clone());
    let refiners = RefinersServiceClient::new(ch.refiners.clone());
    let scorer = ScorerServiceClient::new(ch.scorer.clone());
    let arbiter = ArbiterServiceClient::new(ch.arbiter.clone());
    let delta = DeltaJudgeServiceClient::new(ch.delta_judge.clone());
    let debate = DebateServiceClient::new(ch.debate.clone());
    let huge = huge_text();

    // --- gateway.Evaluate (the checklist_eval pipeline, waited for)
    const EVALUATE: &str = "gateway.Evaluate";
    t.invalid(
        EVALUATE,
        Empty,
        "pipeline",
        unary!(gateway, evaluate, gw::EvaluateRequest { pipeline: None, budget: None }),
    );
    t.invalid(EVALUATE, Empty, "pipeline.records", unary!(gateway, evaluate, evaluate(|p| p.records.clear())));
    t.invalid(
        EVALUATE,
        ControlChars,
        "pipeline.generator_model.backend",
        unary!(
            gateway,
            evaluate,
            evaluate(|p| {
                p.source = Some(gw::ChecklistSource {
                    source: Some(gw::checklist_source::Source::Preset(gn::Preset::Tick as i32)),
                });
                p.records[0].input = "Write about leaves.".into();
                p.generator_model = spec(|s| s.backend = CONTROL_BACKEND.into());
            })
        ),
    );
    t.invalid(
        EVALUATE,
        Empty,
        "pipeline.source.checklist.items",
        unary!(gateway, evaluate, evaluate(|p| items_of(p).clear())),
    );
    t.invalid(
        EVALUATE,
        ControlChars,
        "pipeline.records[0].target",
        unary!(gateway, evaluate, evaluate(|p| p.records[0].target = CONTROL_BLANK.into())),
    );
    t.invalid(
        EVALUATE,
        Huge,
        "pipeline.records[0].target",
        unary!(gateway, evaluate, evaluate(|p| p.records[0].target = huge.clone())),
    );
    t.invalid(
        EVALUATE,
        Huge,
        "pipeline.records[0].id",
        unary!(gateway, evaluate, evaluate(|p| p.records[0].id = "r".repeat(1024))),
    );
    t.invalid(
        EVALUATE,
        Nan,
        "pipeline.source.checklist.items[0].weight",
        unary!(gateway, evaluate, evaluate(|p| items_of(p)[0].weight = Some(f64::NAN))),
    );
    t.invalid(
        EVALUATE,
        Infinite,
        "pipeline.scorer_model.temperature",
        unary!(gateway, evaluate, evaluate(|p| p.scorer_model = spec(|s| s.temperature = Some(f64::INFINITY)))),
    );
    t.invalid(
        EVALUATE,
        Negative,
        "pipeline.source.checklist.items[1].weight",
        unary!(gateway, evaluate, evaluate(|p| items_of(p)[1].weight = Some(-1.0))),
    );
    t.invalid(
        EVALUATE,
        UnknownEnum,
        "pipeline.scorer.mode",
        unary!(gateway, evaluate, evaluate(|p| p.scorer = Some(pb::ScorerConfig { mode: 42, ..Default::default() }))),
    );
    t.invalid(
        EVALUATE,
        UnknownEnum,
        "pipeline.source.preset",
        unary!(
            gateway,
            evaluate,
            evaluate(
                |p| p.source = Some(gw::ChecklistSource { source: Some(gw::checklist_source::Source::Preset(99)) })
            )
        ),
    );
    t.invalid(
        EVALUATE,
        DuplicateId,
        "pipeline.records[1].id",
        unary!(gateway, evaluate, evaluate(|p| p.records.push(p.records[0].clone()))),
    );
    // An empty id would take its position, which may be another record's id ("1" twice before).
    t.invalid(
        EVALUATE,
        DuplicateId,
        "pipeline.records[1].id",
        unary!(
            gateway,
            evaluate,
            evaluate(|p| {
                p.records.truncate(1);
                p.records[0].id = "1".into();
                p.records.push(gw::EvalRecord { id: String::new(), ..p.records[0].clone() });
            })
        ),
    );
    t.invalid(
        EVALUATE,
        DuplicateId,
        "pipeline.source.checklist.items[1].id",
        unary!(gateway, evaluate, evaluate(|p| items_of(p)[1].id = "lines".into())),
    );
    t.invalid(
        EVALUATE,
        OutOfRange,
        "pipeline.concurrency",
        unary!(gateway, evaluate, evaluate(|p| p.concurrency = 257)),
    );
    t.invalid(
        EVALUATE,
        InvalidUtf8,
        "pipeline.records.target",
        raw(
            &ch.gateway,
            "/assay.gateway.v1.GatewayService/Evaluate",
            corrupt(&evaluate(|p| p.records[0].target = MARK.into())),
            false,
        ),
    );

    // --- gateway.RunPipeline, every pipeline kind
    const RUN: &str = "gateway.RunPipeline";
    t.invalid(
        RUN,
        Empty,
        "pipeline",
        streaming!(
            gateway,
            run_pipeline,
            gw::RunPipelineRequest { open: false, pipeline: None, label: String::new(), budget: None }
        ),
    );
    t.invalid(
        RUN,
        Huge,
        "label",
        streaming!(
            gateway,
            run_pipeline,
            gw::RunPipelineRequest {
                open: false,
                pipeline: Some(Pipeline::ChecklistEval(eval_pipeline())),
                label: "l".repeat(4096),
                budget: None,
            }
        ),
    );
    t.invalid(
        RUN,
        InvalidUtf8,
        "label",
        raw(
            &ch.gateway,
            "/assay.gateway.v1.GatewayService/RunPipeline",
            corrupt(&gw::RunPipelineRequest {
                open: false,
                pipeline: Some(Pipeline::ChecklistEval(eval_pipeline())),
                label: MARK.into(),
                budget: None,
            }),
            true,
        ),
    );
    // checklist_eval
    const RUN_EVAL: &str = "gateway.RunPipeline[checklist_eval]";
    let mut p = eval_pipeline();
    p.records.clear();
    t.invalid(RUN_EVAL, Empty, "pipeline.records", streaming!(gateway, run_pipeline, run(Pipeline::ChecklistEval(p))));
    let mut p = eval_pipeline();
    p.scorer = Some(pb::ScorerConfig { prompt: 7, ..Default::default() });
    t.invalid(
        RUN_EVAL,
        UnknownEnum,
        "pipeline.scorer.prompt",
        streaming!(gateway, run_pipeline, run(Pipeline::ChecklistEval(p))),
    );
    let mut p = eval_pipeline();
    p.generator_model = spec(|s| s.top_p = Some(f64::NAN));
    t.invalid(
        RUN_EVAL,
        Nan,
        "pipeline.generator_model.top_p",
        streaming!(gateway, run_pipeline, run(Pipeline::ChecklistEval(p))),
    );
    // generate_checklist
    const RUN_GENERATE: &str = "gateway.RunPipeline[generate_checklist]";
    t.invalid(
        RUN_GENERATE,
        ControlChars,
        "pipeline.record.input",
        streaming!(
            gateway,
            run_pipeline,
            generate_checklist(|p| p.record.as_mut().unwrap().input = CONTROL_BLANK.into())
        ),
    );
    t.invalid(
        RUN_GENERATE,
        Empty,
        "pipeline.refiners",
        streaming!(
            gateway,
            run_pipeline,
            generate_checklist(|p| p.source =
                Some(gw::ChecklistSource { source: Some(gw::checklist_source::Source::Checklist(checklist())) }))
        ),
    );
    t.invalid(
        RUN_GENERATE,
        UnknownEnum,
        "pipeline.source.preset",
        streaming!(
            gateway,
            run_pipeline,
            generate_checklist(
                |p| p.source = Some(gw::ChecklistSource { source: Some(gw::checklist_source::Source::Preset(-5)) })
            )
        ),
    );
    t.invalid(
        RUN_GENERATE,
        Nan,
        "pipeline.refiners[0].deduplicate.threshold",
        streaming!(
            gateway,
            run_pipeline,
            generate_checklist(|p| p.refiners = vec![rf::RefinerStep {
                step: Some(rf::refiner_step::Step::Deduplicate(rf::DeduplicateRequest {
                    threshold: Some(f64::NAN),
                    ..Default::default()
                })),
            }])
        ),
    );
    t.invalid(
        RUN_GENERATE,
        OutOfRange,
        "pipeline.max_items",
        streaming!(gateway, run_pipeline, generate_checklist(|p| p.max_items = Some(0))),
    );
    // targeted_refinement
    const RUN_TARGETED: &str = "gateway.RunPipeline[targeted_refinement]";
    t.invalid(
        RUN_TARGETED,
        Empty,
        "pipeline.sections",
        streaming!(gateway, run_pipeline, targeted(|p| p.sections.clear())),
    );
    t.invalid(
        RUN_TARGETED,
        DuplicateId,
        "pipeline.sections[1].id",
        streaming!(gateway, run_pipeline, targeted(|p| p.sections[1].id = "intro".into())),
    );
    t.invalid(
        RUN_TARGETED,
        Nan,
        "pipeline.lock_threshold",
        streaming!(gateway, run_pipeline, targeted(|p| p.lock_threshold = Some(f64::NAN))),
    );
    t.invalid(
        RUN_TARGETED,
        OutOfRange,
        "pipeline.max_iterations",
        streaming!(gateway, run_pipeline, targeted(|p| p.max_iterations = Some(11))),
    );
    t.invalid(
        RUN_TARGETED,
        OutOfRange,
        "pipeline.token_budget",
        streaming!(gateway, run_pipeline, targeted(|p| p.token_budget = Some(999))),
    );
    t.invalid(RUN_TARGETED, UnknownEnum, "pipeline.mode", streaming!(gateway, run_pipeline, targeted(|p| p.mode = 9)));
    t.invalid(
        RUN_TARGETED,
        Infinite,
        "pipeline.verdicts[0].overall_score",
        streaming!(
            gateway,
            run_pipeline,
            targeted(|p| p.verdicts = vec![pb::JudgeVerdict { overall_score: f64::INFINITY, ..verdict("j1") }])
        ),
    );
    t.invalid(
        RUN_TARGETED,
        Negative,
        "pipeline.verdicts[0].criterion_scores[\"clarity_readability\"]",
        streaming!(
            gateway,
            run_pipeline,
            targeted(|p| {
                let mut v = verdict("j1");
                v.criterion_scores.insert("clarity_readability".into(), -0.1);
                p.verdicts = vec![v];
            })
        ),
    );
    t.invalid(
        RUN_TARGETED,
        DuplicateId,
        "pipeline.judges[1].id",
        streaming!(
            gateway,
            run_pipeline,
            targeted(|p| p.judges =
                vec![sc::PanelJudge { id: "j".into(), model: None }, sc::PanelJudge { id: "j".into(), model: None }])
        ),
    );
    t.invalid(
        RUN_TARGETED,
        OutOfRange,
        "pipeline.self_refine.max_passes",
        streaming!(
            gateway,
            run_pipeline,
            targeted(|p| p.self_refine = Some(rf::SelfRefineHook { max_passes: Some(6), ..Default::default() }))
        ),
    );
    // self_refine
    const RUN_SELF_REFINE: &str = "gateway.RunPipeline[self_refine]";
    t.invalid(
        RUN_SELF_REFINE,
        Empty,
        "pipeline.request",
        streaming!(gateway, run_pipeline, run(Pipeline::SelfRefine(gw::SelfRefinePipeline { request: None }))),
    );
    t.invalid(
        RUN_SELF_REFINE,
        ControlChars,
        "pipeline.request.draft",
        streaming!(gateway, run_pipeline, self_refine_run(|r| r.draft = CONTROL_BLANK.into())),
    );
    t.invalid(
        RUN_SELF_REFINE,
        OutOfRange,
        "pipeline.request.max_passes",
        streaming!(gateway, run_pipeline, self_refine_run(|r| r.max_passes = Some(0))),
    );
    t.invalid(
        RUN_SELF_REFINE,
        UnknownEnum,
        "pipeline.request.convergence_mode",
        streaming!(gateway, run_pipeline, self_refine_run(|r| r.convergence_mode = -3)),
    );
    // debate
    const RUN_DEBATE_PIPELINE: &str = "gateway.RunPipeline[debate]";
    t.invalid(
        RUN_DEBATE_PIPELINE,
        Empty,
        "pipeline.problems",
        streaming!(gateway, run_pipeline, debate_run(|p| p.problems.clear())),
    );
    t.invalid(
        RUN_DEBATE_PIPELINE,
        DuplicateId,
        "pipeline.problems[1].id",
        streaming!(gateway, run_pipeline, debate_run(|p| p.problems.push(p.problems[0].clone()))),
    );
    t.invalid(
        RUN_DEBATE_PIPELINE,
        OutOfRange,
        "pipeline.rounds",
        streaming!(gateway, run_pipeline, debate_run(|p| p.rounds = Some(0))),
    );
    t.invalid(
        RUN_DEBATE_PIPELINE,
        Negative,
        "pipeline.judge_model.temperature",
        streaming!(gateway, run_pipeline, debate_run(|p| p.judge_model = spec(|s| s.temperature = Some(-0.5)))),
    );
    t.invalid(
        RUN_DEBATE_PIPELINE,
        ControlChars,
        "pipeline.problems[0].reference",
        streaming!(gateway, run_pipeline, debate_run(|p| p.problems[0].reference = Some("\u{1}\u{2}\u{7f}".into()))),
    );
    t.invalid(
        RUN_DEBATE_PIPELINE,
        Huge,
        "pipeline.problems[0].problem",
        streaming!(gateway, run_pipeline, debate_run(|p| p.problems[0].problem = huge.clone())),
    );
    t.invalid(
        RUN_DEBATE_PIPELINE,
        OutOfRange,
        "pipeline.solvers",
        streaming!(gateway, run_pipeline, debate_run(|p| p.solvers = solvers()[..2].to_vec())),
    );

    // --- gateway.GetRun / ListRuns / WatchRun / ControlRun
    const GET: &str = "gateway.GetRun";
    t.invalid(GET, Empty, "run_id", unary!(gateway, get_run, gw::GetRunRequest { run_id: String::new() }));
    t.not_found(
        GET,
        UnknownRunId,
        "no-such-run",
        unary!(gateway, get_run, gw::GetRunRequest { run_id: "no-such-run".into() }),
    );
    t.not_found(
        GET,
        UnknownRunId,
        "run",
        unary!(gateway, get_run, gw::GetRunRequest { run_id: "run\u{0}\u{7}\n\u{1b}[2J".into() }),
    );
    t.not_found(GET, UnknownRunId, "run", unary!(gateway, get_run, gw::GetRunRequest { run_id: "r".repeat(100_000) }));
    t.invalid(
        GET,
        InvalidUtf8,
        "run_id",
        raw(
            &ch.gateway,
            "/assay.gateway.v1.GatewayService/GetRun",
            corrupt(&gw::GetRunRequest { run_id: MARK.into() }),
            false,
        ),
    );
    const LIST: &str = "gateway.ListRuns";
    t.invalid(
        LIST,
        OutOfRange,
        "page_size",
        unary!(gateway, list_runs, gw::ListRunsRequest { page_size: 501, ..Default::default() }),
    );
    t.invalid(
        LIST,
        UnknownEnum,
        "kind",
        unary!(gateway, list_runs, gw::ListRunsRequest { kind: 99, ..Default::default() }),
    );
    t.invalid(
        LIST,
        UnknownEnum,
        "state",
        unary!(gateway, list_runs, gw::ListRunsRequest { state: -1, ..Default::default() }),
    );
    t.invalid(
        LIST,
        ControlChars,
        "page_token",
        unary!(
            gateway,
            list_runs,
            gw::ListRunsRequest { page_token: "\u{0}\u{1b}:\u{7}".into(), ..Default::default() }
        ),
    );
    t.invalid(
        LIST,
        InvalidUtf8,
        "page_token",
        raw(
            &ch.gateway,
            "/assay.gateway.v1.GatewayService/ListRuns",
            corrupt(&gw::ListRunsRequest { page_token: MARK.into(), ..Default::default() }),
            false,
        ),
    );
    const WATCH: &str = "gateway.WatchRun";
    t.invalid(WATCH, Empty, "run_id", streaming!(gateway, watch_run, gw::WatchRunRequest::default()));
    t.not_found(
        WATCH,
        UnknownRunId,
        "0190f1c2-0000-7000-8000-000000000000",
        streaming!(
            gateway,
            watch_run,
            gw::WatchRunRequest { run_id: "0190f1c2-0000-7000-8000-000000000000".into(), after_sequence: u64::MAX }
        ),
    );
    t.invalid(
        WATCH,
        InvalidUtf8,
        "run_id",
        raw(
            &ch.gateway,
            "/assay.gateway.v1.GatewayService/WatchRun",
            corrupt(&gw::WatchRunRequest { run_id: MARK.into(), after_sequence: 0 }),
            true,
        ),
    );
    const CONTROL: &str = "gateway.ControlRun";
    let cancel = |run_id: &str| gw::ControlRunRequest {
        run_id: run_id.into(),
        action: Some(gw::control_run_request::Action::Cancel(gw::CancelRun {})),
        actor: "tester".into(),
        reason: "bad input".into(),
    };
    t.invalid(CONTROL, Empty, "run_id", unary!(gateway, control_run, cancel("")));
    t.invalid(
        CONTROL,
        Empty,
        "action",
        unary!(gateway, control_run, gw::ControlRunRequest { action: None, ..cancel("no-such-run") }),
    );
    t.not_found(CONTROL, UnknownRunId, "no-such-run", unary!(gateway, control_run, cancel("no-such-run")));
    t.invalid(
        CONTROL,
        Huge,
        "actor",
        unary!(gateway, control_run, gw::ControlRunRequest { actor: "a".repeat(201), ..cancel("no-such-run") }),
    );
    t.invalid(
        CONTROL,
        Huge,
        "reason",
        unary!(gateway, control_run, gw::ControlRunRequest { reason: "r".repeat(2_001), ..cancel("no-such-run") }),
    );
    t.invalid(
        CONTROL,
        InvalidUtf8,
        "actor",
        raw(
            &ch.gateway,
            "/assay.gateway.v1.GatewayService/ControlRun",
            corrupt(&gw::ControlRunRequest { actor: MARK.into(), ..cancel("no-such-run") }),
            false,
        ),
    );

    // --- generator
    const GENERATE: &str = "generator.Generate";
    t.invalid(GENERATE, Empty, "preset", unary!(generator, generate, generate(|r| r.preset = 0)));
    t.invalid(GENERATE, UnknownEnum, "preset", unary!(generator, generate, generate(|r| r.preset = 99)));
    t.invalid(
        GENERATE,
        UnknownEnum,
        "preset",
        unary!(generator, generate, generate(|r| r.preset = gn::Preset::Feedback as i32)),
    );
    t.invalid(GENERATE, Empty, "input", unary!(generator, generate, generate(|r| r.input.clear())));
    t.invalid(
        GENERATE,
        ControlChars,
        "input",
        unary!(generator, generate, generate(|r| r.input = CONTROL_BLANK.into())),
    );
    t.invalid(GENERATE, Huge, "input", unary!(generator, generate, generate(|r| r.input = huge.clone())));
    t.invalid(GENERATE, OutOfRange, "max_items", unary!(generator, generate, generate(|r| r.max_items = Some(0))));
    t.invalid(
        GENERATE,
        Nan,
        "model.temperature",
        unary!(generator, generate, generate(|r| r.model = spec(|s| s.temperature = Some(f64::NAN)))),
    );
    t.invalid(
        GENERATE,
        ControlChars,
        "model.backend",
        unary!(generator, generate, generate(|r| r.model = spec(|s| s.backend = CONTROL_BACKEND.into()))),
    );
    t.invalid(
        GENERATE,
        OutOfRange,
        "candidate_models[0].max_tokens",
        unary!(
            generator,
            generate,
            generate(|r| r.candidate_models = vec![pb::ModelSpec { max_tokens: Some(0), ..Default::default() }])
        ),
    );
    t.invalid(
        GENERATE,
        InvalidUtf8,
        "input",
        raw(
            &ch.generator,
            "/assay.generator.v1.GeneratorService/Generate",
            corrupt(&generate(|r| r.input = MARK.into())),
            false,
        ),
    );
    const CORPUS: &str = "generator.GenerateCorpus";
    t.invalid(
        CORPUS,
        UnknownEnum,
        "preset",
        unary!(generator, generate_corpus, corpus(|r| r.preset = gn::Preset::Tick as i32)),
    );
    t.invalid(CORPUS, Empty, "observations", unary!(generator, generate_corpus, corpus(|r| r.observations.clear())));
    t.invalid(
        CORPUS,
        DuplicateId,
        "dimensions[1].name",
        unary!(
            generator,
            generate_corpus,
            corpus(|r| {
                r.preset = gn::Preset::Checkeval as i32;
                r.observations.clear();
                r.dimensions = vec![dimension("fluency"), dimension(" Fluency ")];
            })
        ),
    );
    t.invalid(CORPUS, UnknownEnum, "augmentation", unary!(generator, generate_corpus, corpus(|r| r.augmentation = 9)));
    t.invalid(
        CORPUS,
        Nan,
        "refinement.dedup_threshold",
        unary!(
            generator,
            generate_corpus,
            corpus(
                |r| r.refinement = Some(gn::CorpusRefinement { dedup_threshold: Some(f64::NAN), ..Default::default() })
            )
        ),
    );
    t.invalid(CORPUS, OutOfRange, "batch_size", unary!(generator, generate_corpus, corpus(|r| r.batch_size = Some(0))));
    const CORPUS_STREAM: &str = "generator.GenerateCorpusStream";
    t.invalid(
        CORPUS_STREAM,
        Empty,
        "request",
        streaming!(generator, generate_corpus_stream, gn::GenerateCorpusStreamRequest { request: None }),
    );
    t.invalid(
        CORPUS_STREAM,
        ControlChars,
        "request.observations[0]",
        streaming!(
            generator,
            generate_corpus_stream,
            gn::GenerateCorpusStreamRequest { request: Some(corpus(|r| r.observations[0] = CONTROL_BLANK.into())) }
        ),
    );
    t.invalid(
        CORPUS_STREAM,
        InvalidUtf8,
        "request.observations",
        raw(
            &ch.generator,
            "/assay.generator.v1.GeneratorService/GenerateCorpusStream",
            corrupt(&gn::GenerateCorpusStreamRequest { request: Some(corpus(|r| r.observations[1] = MARK.into())) }),
            true,
        ),
    );
    // ListPresets takes no fields: only broken bytes can be wrong.
    t.invalid(
        "generator.ListPresets",
        InvalidUtf8,
        "request",
        raw(&ch.generator, "/assay.generator.v1.GeneratorService/ListPresets", vec![0xFF], false),
    );

    // --- refiners
    const DEDUP: &str = "refiners.Deduplicate";
    let dedup = |f: &dyn Fn(&mut rf::DeduplicateRequest)| {
        let mut r = rf::DeduplicateRequest { items: items(), ..Default::default() };
        f(&mut r);
        r
    };
    t.invalid(DEDUP, Empty, "items", unary!(refiners, deduplicate, dedup(&|r| r.items.clear())));
    t.invalid(DEDUP, Nan, "threshold", unary!(refiners, deduplicate, dedup(&|r| r.threshold = Some(f64::NAN))));
    t.invalid(DEDUP, Negative, "threshold", unary!(refiners, deduplicate, dedup(&|r| r.threshold = Some(-0.5))));
    t.invalid(
        DEDUP,
        DuplicateId,
        "items[1].id",
        unary!(refiners, deduplicate, dedup(&|r| r.items[1].id = "lines".into())),
    );
    t.invalid(
        DEDUP,
        ControlChars,
        "embedding_model.backend",
        unary!(refiners, deduplicate, dedup(&|r| r.embedding_model = spec(|s| s.backend = CONTROL_BACKEND.into()))),
    );
    const TAG: &str = "refiners.Tag";
    t.invalid(
        TAG,
        OutOfRange,
        "concurrency",
        unary!(refiners, tag, rf::TagRequest { items: items(), model: None, concurrency: 100_000 }),
    );
    t.invalid(
        TAG,
        ControlChars,
        "items[0].question",
        unary!(refiners, tag, rf::TagRequest { items: vec![item("a", CONTROL_BLANK)], model: None, concurrency: 0 }),
    );
    const UNIT: &str = "refiners.UnitTest";
    t.invalid(UNIT, Empty, "samples", unary!(refiners, unit_test, unit_test(|r| r.samples.clear())));
    t.invalid(
        UNIT,
        UnknownEnum,
        "samples[0].answers[\"lines\"]",
        unary!(
            refiners,
            unit_test,
            unit_test(|r| {
                r.samples[0].answers.insert("lines".into(), 7);
            })
        ),
    );
    t.invalid(
        UNIT,
        DuplicateId,
        "samples[1].id",
        unary!(refiners, unit_test, unit_test(|r| r.samples.push(r.samples[0].clone()))),
    );
    const SELECT: &str = "refiners.Select";
    let select = |f: &dyn Fn(&mut rf::SelectRequest)| {
        let mut r = rf::SelectRequest { items: items(), ..Default::default() };
        f(&mut r);
        r
    };
    t.invalid(SELECT, OutOfRange, "max_questions", unary!(refiners, select, select(&|r| r.max_questions = Some(0))));
    t.invalid(SELECT, Infinite, "alpha", unary!(refiners, select, select(&|r| r.alpha = Some(f64::INFINITY))));
    t.invalid(SELECT, Negative, "length_penalty", unary!(refiners, select, select(&|r| r.length_penalty = Some(-1.0))));
    const CHAIN: &str = "refiners.RefineChecklist";
    let chain = |steps: Vec<rf::RefinerStep>| rf::RefineChecklistRequest { items: items(), steps };
    t.invalid(CHAIN, Empty, "steps", unary!(refiners, refine_checklist, chain(vec![])));
    t.invalid(
        CHAIN,
        Empty,
        "steps[0]",
        unary!(refiners, refine_checklist, chain(vec![rf::RefinerStep { step: None }])),
    );
    t.invalid(
        CHAIN,
        OutOfRange,
        "steps[0].select.beam_width",
        unary!(
            refiners,
            refine_checklist,
            chain(vec![rf::RefinerStep {
                step: Some(rf::refiner_step::Step::Select(rf::SelectRequest {
                    beam_width: Some(0),
                    ..Default::default()
                })),
            }])
        ),
    );
    const CHAIN_STREAM: &str = "refiners.RefineChecklistStream";
    t.invalid(
        CHAIN_STREAM,
        Empty,
        "request",
        streaming!(refiners, refine_checklist_stream, rf::RefineChecklistStreamRequest { request: None }),
    );
    t.invalid(
        CHAIN_STREAM,
        Nan,
        "request.items[0].weight",
        streaming!(
            refiners,
            refine_checklist_stream,
            rf::RefineChecklistStreamRequest {
                request: Some(rf::RefineChecklistRequest {
                    items: vec![pb::ChecklistItem { weight: Some(f64::NAN), ..item("a", "Is it short?") }],
                    steps: vec![rf::RefinerStep {
                        step: Some(rf::refiner_step::Step::Select(rf::SelectRequest::default())),
                    }],
                }),
            }
        ),
    );
    const SELF_REFINE: &str = "refiners.SelfRefine";
    let self_refine = |f: &dyn Fn(&mut rf::SelfRefineRequest)| {
        let mut r = draft();
        f(&mut r);
        r
    };
    t.invalid(SELF_REFINE, Empty, "draft", unary!(refiners, self_refine, self_refine(&|r| r.draft.clear())));
    t.invalid(
        SELF_REFINE,
        OutOfRange,
        "max_passes",
        unary!(refiners, self_refine, self_refine(&|r| r.max_passes = Some(6))),
    );
    t.invalid(
        SELF_REFINE,
        Huge,
        "instruction",
        unary!(refiners, self_refine, self_refine(&|r| r.instruction = huge_text())),
    );
    t.invalid(
        SELF_REFINE,
        InvalidUtf8,
        "draft",
        raw(
            &ch.refiners,
            "/assay.refiners.v1.RefinersService/SelfRefine",
            corrupt(&self_refine(&|r| r.draft = format!("{} {MARK}", r.draft))),
            false,
        ),
    );
    const SELF_REFINE_STREAM: &str = "refiners.SelfRefineStream";
    t.invalid(
        SELF_REFINE_STREAM,
        Empty,
        "request",
        streaming!(refiners, self_refine_stream, rf::SelfRefineStreamRequest { request: None }),
    );
    t.invalid(
        SELF_REFINE_STREAM,
        ControlChars,
        "request.model.backend",
        streaming!(
            refiners,
            self_refine_stream,
            rf::SelfRefineStreamRequest {
                request: Some(self_refine(&|r| r.model = spec(|s| s.backend = CONTROL_BACKEND.into())))
            }
        ),
    );
    const PATCH: &str = "refiners.Patch";
    t.invalid(PATCH, Empty, "section", unary!(refiners, patch, patch(|r| r.section = None)));
    t.invalid(PATCH, Empty, "instruction", unary!(refiners, patch, patch(|r| r.instruction.clear())));
    t.invalid(
        PATCH,
        UnknownEnum,
        "issues[0].severity",
        unary!(refiners, patch, patch(|r| r.issues = vec![pb::JudgeIssue { severity: 0, ..issue("stages") }])),
    );
    t.invalid(
        PATCH,
        DuplicateId,
        "previous.id",
        unary!(refiners, patch, patch(|r| r.previous = Some(sections()[1].clone()))),
    );
    t.invalid(PATCH, Huge, "instruction", unary!(refiners, patch, patch(|r| r.instruction = "i".repeat(8 * 1024 + 1))));
    const EXPAND: &str = "refiners.ExpandSection";
    t.invalid(EXPAND, OutOfRange, "target_words", unary!(refiners, expand_section, expand(|r| r.target_words = 5001)));
    t.invalid(
        EXPAND,
        ControlChars,
        "section.content",
        unary!(refiners, expand_section, expand(|r| r.section.as_mut().unwrap().content = CONTROL_BLANK.into())),
    );
    t.invalid(
        EXPAND,
        UnknownEnum,
        "issues[0].severity",
        unary!(
            refiners,
            expand_section,
            expand(|r| r.issues = vec![pb::JudgeIssue { severity: 42, ..issue("stages") }])
        ),
    );

    // --- scorer
    const SCORE: &str = "scorer.Score";
    t.invalid(SCORE, Empty, "checklist", unary!(scorer, score, score(|r| r.checklist = None)));
    t.invalid(SCORE, Empty, "targets", unary!(scorer, score, score(|r| r.targets.clear())));
    t.invalid(
        SCORE,
        ControlChars,
        "targets[0].target",
        unary!(scorer, score, score(|r| r.targets[0].target = CONTROL_BLANK.into())),
    );
    t.invalid(SCORE, Huge, "targets[0].target", unary!(scorer, score, score(|r| r.targets[0].target = huge_text())));
    t.invalid(
        SCORE,
        Huge,
        "targets",
        unary!(scorer, score, score(|r| r.targets = vec![r.targets[0].clone(); assay_domain::limits::MAX_TARGETS + 1])),
    );
    t.invalid(
        SCORE,
        Nan,
        "checklist.items[0].weight",
        unary!(scorer, score, score(|r| r.checklist.as_mut().unwrap().items[0].weight = Some(f64::NAN))),
    );
    t.invalid(
        SCORE,
        UnknownEnum,
        "config.mode",
        unary!(scorer, score, score(|r| r.config = Some(pb::ScorerConfig { mode: 3, ..Default::default() }))),
    );
    t.invalid(
        SCORE,
        DuplicateId,
        "checklist.items[1].id",
        unary!(scorer, score, score(|r| r.checklist.as_mut().unwrap().items[1].id = "lines".into())),
    );
    t.invalid(
        SCORE,
        OutOfRange,
        "model.top_p",
        unary!(scorer, score, score(|r| r.model = spec(|s| s.top_p = Some(1.5)))),
    );
    t.invalid(
        SCORE,
        InvalidUtf8,
        "checklist.items.question",
        raw(
            &ch.scorer,
            "/assay.scorer.v1.ScorerService/Score",
            corrupt(&score(|r| r.checklist.as_mut().unwrap().items[1].question = MARK.into())),
            false,
        ),
    );
    const SCORE_STREAM: &str = "scorer.ScoreStream";
    t.invalid(
        SCORE_STREAM,
        Empty,
        "request",
        streaming!(scorer, score_stream, sc::ScoreStreamRequest { request: None }),
    );
    t.invalid(
        SCORE_STREAM,
        OutOfRange,
        "request.config.concurrency",
        streaming!(
            scorer,
            score_stream,
            sc::ScoreStreamRequest {
                request: Some(score(|r| r.config = Some(pb::ScorerConfig { concurrency: 257, ..Default::default() })))
            }
        ),
    );
    t.invalid(
        SCORE_STREAM,
        ControlChars,
        "request.model.backend",
        streaming!(
            scorer,
            score_stream,
            sc::ScoreStreamRequest { request: Some(score(|r| r.model = spec(|s| s.backend = CONTROL_BACKEND.into()))) }
        ),
    );
    const JUDGE: &str = "scorer.JudgeSections";
    t.invalid(JUDGE, Empty, "sections", unary!(scorer, judge_sections, judge_sections(|r| r.sections.clear())));
    t.invalid(
        JUDGE,
        DuplicateId,
        "sections[1].id",
        unary!(scorer, judge_sections, judge_sections(|r| r.sections[1].id = "intro".into())),
    );
    t.invalid(
        JUDGE,
        Huge,
        "judges",
        unary!(scorer, judge_sections, judge_sections(|r| r.judges = vec![sc::PanelJudge::default(); 10])),
    );
    t.invalid(
        JUDGE,
        Nan,
        "judges[0].model.temperature",
        unary!(
            scorer,
            judge_sections,
            judge_sections(
                |r| r.judges = vec![sc::PanelJudge { id: "j".into(), model: spec(|s| s.temperature = Some(f64::NAN)) }]
            )
        ),
    );
    t.invalid(
        JUDGE,
        OutOfRange,
        "criteria[0].priority",
        unary!(
            scorer,
            judge_sections,
            judge_sections(|r| r.criteria = vec![pb::Criterion { name: "c".into(), priority: 0, ..Default::default() }])
        ),
    );
    const JUDGE_STREAM: &str = "scorer.JudgeSectionsStream";
    t.invalid(
        JUDGE_STREAM,
        Empty,
        "request",
        streaming!(scorer, judge_sections_stream, sc::JudgeSectionsStreamRequest { request: None }),
    );
    t.invalid(
        JUDGE_STREAM,
        DuplicateId,
        "request.judges[1].id",
        streaming!(
            scorer,
            judge_sections_stream,
            sc::JudgeSectionsStreamRequest {
                request: Some(judge_sections(|r| r.judges = vec![
                    sc::PanelJudge { id: "j".into(), model: None },
                    sc::PanelJudge { id: "j".into(), model: None }
                ]))
            }
        ),
    );

    // --- arbiter
    const AGREE: &str = "arbiter.ComputeAgreement";
    let ratings = |values: Vec<Option<f64>>| ar::ComputeAgreementRequest {
        raters: vec![
            ar::RaterValues { values: values.into_iter().map(|value| ar::OptionalValue { value }).collect() },
            ar::RaterValues {
                values: vec![ar::OptionalValue { value: Some(1.0) }, ar::OptionalValue { value: Some(2.0) }],
            },
        ],
        level: 0,
    };
    t.invalid(AGREE, Empty, "raters", unary!(arbiter, compute_agreement, ar::ComputeAgreementRequest::default()));
    t.invalid(
        AGREE,
        Nan,
        "raters[0].values[1].value",
        unary!(arbiter, compute_agreement, ratings(vec![Some(1.0), Some(f64::NAN)])),
    );
    t.invalid(
        AGREE,
        Infinite,
        "raters[0].values[0].value",
        unary!(arbiter, compute_agreement, ratings(vec![Some(f64::NEG_INFINITY), None])),
    );
    t.invalid(
        AGREE,
        UnknownEnum,
        "level",
        unary!(arbiter, compute_agreement, ar::ComputeAgreementRequest { level: 9, ..ratings(vec![Some(1.0)]) }),
    );
    const CONSOLIDATE: &str = "arbiter.Consolidate";
    t.invalid(CONSOLIDATE, Empty, "verdicts", unary!(arbiter, consolidate, consolidate(|r| r.verdicts.clear())));
    t.invalid(
        CONSOLIDATE,
        DuplicateId,
        "verdicts[1].judge_id",
        unary!(arbiter, consolidate, consolidate(|r| r.verdicts[1].judge_id = "j1".into())),
    );
    t.invalid(
        CONSOLIDATE,
        Nan,
        "match_threshold",
        unary!(arbiter, consolidate, consolidate(|r| r.match_threshold = Some(f64::NAN))),
    );
    t.invalid(
        CONSOLIDATE,
        Infinite,
        "verdicts[0].overall_score",
        unary!(arbiter, consolidate, consolidate(|r| r.verdicts[0].overall_score = f64::INFINITY)),
    );
    t.invalid(CONSOLIDATE, UnknownEnum, "level", unary!(arbiter, consolidate, consolidate(|r| r.level = -2)));
    const ROUTE: &str = "arbiter.Route";
    t.invalid(ROUTE, Empty, "sections", unary!(arbiter, route, route(|r| r.sections.clear())));
    t.invalid(
        ROUTE,
        Nan,
        "criterion_scores[\"clarity\"]",
        unary!(
            arbiter,
            route,
            route(|r| {
                r.criterion_scores.insert("clarity".into(), f64::NAN);
            })
        ),
    );
    t.invalid(ROUTE, UnknownEnum, "issues[0].severity", unary!(arbiter, route, route(|r| r.issues[0].severity = 9)));
    t.invalid(
        ROUTE,
        Empty,
        "instructions[0].section_id",
        unary!(arbiter, route, route(|r| r.instructions = vec![ar::SectionInstruction::default()])),
    );
    const PLAN: &str = "arbiter.Plan";
    t.invalid(
        PLAN,
        OutOfRange,
        "max_parallel_patchers",
        unary!(arbiter, plan, plan(|r| r.max_parallel_patchers = Some(4))),
    );
    t.invalid(
        PLAN,
        ControlChars,
        "locked_section_ids[0]",
        unary!(arbiter, plan, plan(|r| r.locked_section_ids = vec![CONTROL_BLANK.into()])),
    );
    t.invalid(
        PLAN,
        InvalidUtf8,
        "sections.content",
        raw(
            &ch.arbiter,
            "/assay.arbiter.v1.ArbiterService/Plan",
            corrupt(&plan(|r| r.sections[0].content = MARK.into())),
            false,
        ),
    );

    // --- delta judge
    const VERIFY: &str = "delta_judge.Verify";
    t.invalid(VERIFY, Empty, "before", unary!(delta, verify, verify_request(|r| r.before = None)));
    t.invalid(
        VERIFY,
        Negative,
        "min_length_ratio",
        unary!(delta, verify, verify_request(|r| r.min_length_ratio = Some(-1.0))),
    );
    t.invalid(
        VERIFY,
        Nan,
        "locks[0].baseline",
        unary!(
            delta,
            verify,
            verify_request(|r| {
                r.locks = vec![dj::QualityLock { criterion: "clarity".into(), baseline: f64::NAN, max_drop: None }];
                r.criterion_scores.insert("clarity".into(), 0.5);
            })
        ),
    );
    t.invalid(
        VERIFY,
        DuplicateId,
        "issues[1].id",
        unary!(delta, verify, verify_request(|r| r.issues.push(issue("stages")))),
    );
    t.invalid(
        VERIFY,
        OutOfRange,
        "min_fix_confidence",
        unary!(delta, verify, verify_request(|r| r.min_fix_confidence = Some(1.5))),
    );
    const CONSISTENCY: &str = "delta_judge.CheckConsistency";
    let consistency = |f: &dyn Fn(&mut dj::CheckConsistencyRequest)| {
        let mut r = dj::CheckConsistencyRequest {
            previous: Some(sections()[0].clone()),
            section: Some(sections()[1].clone()),
            ..Default::default()
        };
        f(&mut r);
        r
    };
    t.invalid(
        CONSISTENCY,
        Empty,
        "section.content",
        unary!(delta, check_consistency, consistency(&|r| r.section.as_mut().unwrap().content.clear())),
    );
    t.invalid(CONSISTENCY, Empty, "previous", unary!(delta, check_consistency, consistency(&|r| r.previous = None)));
    t.invalid(
        CONSISTENCY,
        Huge,
        "previous.content",
        unary!(delta, check_consistency, consistency(&|r| r.previous.as_mut().unwrap().content = huge_text())),
    );
    const READABILITY: &str = "delta_judge.Readability";
    t.invalid(READABILITY, Empty, "text", unary!(delta, readability, dj::ReadabilityRequest { text: String::new() }));
    t.invalid(
        READABILITY,
        ControlChars,
        "text",
        unary!(delta, readability, dj::ReadabilityRequest { text: CONTROL_BLANK.into() }),
    );
    t.invalid(READABILITY, Huge, "text", unary!(delta, readability, dj::ReadabilityRequest { text: huge_text() }));
    t.invalid(
        READABILITY,
        InvalidUtf8,
        "text",
        raw(
            &ch.delta_judge,
            "/assay.delta_judge.v1.DeltaJudgeService/Readability",
            corrupt(&dj::ReadabilityRequest { text: format!("Fine words. {MARK}") }),
            false,
        ),
    );
    const LOCKS: &str = "delta_judge.CheckQualityLocks";
    t.invalid(
        LOCKS,
        Nan,
        "locks[0].baseline",
        unary!(delta, check_quality_locks, locks_request(|r| r.locks[0].baseline = f64::NAN)),
    );
    t.invalid(
        LOCKS,
        Negative,
        "locks[0].max_drop",
        unary!(delta, check_quality_locks, locks_request(|r| r.locks[0].max_drop = Some(-0.1))),
    );
    t.invalid(
        LOCKS,
        DuplicateId,
        "locks[1].criterion",
        unary!(delta, check_quality_locks, locks_request(|r| r.locks.push(r.locks[0].clone()))),
    );
    t.invalid(
        LOCKS,
        Empty,
        "criterion_scores",
        unary!(delta, check_quality_locks, locks_request(|r| r.criterion_scores.clear())),
    );
    t.invalid(
        LOCKS,
        InvalidUtf8,
        "criterion_scores",
        raw(
            &ch.delta_judge,
            "/assay.delta_judge.v1.DeltaJudgeService/CheckQualityLocks",
            corrupt(&locks_request(|r| {
                r.criterion_scores.insert(MARK.into(), 0.5);
            })),
            false,
        ),
    );
    const CONVERGENCE: &str = "delta_judge.CheckConvergence";
    let convergence = |scores: Vec<f64>| dj::CheckConvergenceRequest { scores, ..Default::default() };
    t.invalid(CONVERGENCE, Empty, "scores", unary!(delta, check_convergence, convergence(vec![])));
    t.invalid(CONVERGENCE, Nan, "scores[1]", unary!(delta, check_convergence, convergence(vec![0.5, f64::NAN])));
    t.invalid(CONVERGENCE, Negative, "scores[0]", unary!(delta, check_convergence, convergence(vec![-0.5, 0.6])));
    t.invalid(
        CONVERGENCE,
        Empty,
        "section_edits",
        unary!(
            delta,
            check_convergence,
            dj::CheckConvergenceRequest {
                section_edits: [(String::new(), 1)].into_iter().collect(),
                ..convergence(vec![0.5])
            }
        ),
    );
    const COMPARE: &str = "delta_judge.CompareTexts";
    let compare = |f: &dyn Fn(&mut dj::CompareTextsRequest)| {
        let mut r = dj::CompareTextsRequest {
            previous: "one draft".into(),
            current: "another draft".into(),
            ..Default::default()
        };
        f(&mut r);
        r
    };
    t.invalid(COMPARE, UnknownEnum, "mode", unary!(delta, compare_texts, compare(&|r| r.mode = 7)));
    t.invalid(COMPARE, Huge, "previous", unary!(delta, compare_texts, compare(&|r| r.previous = huge_text())));
    t.invalid(
        COMPARE,
        ControlChars,
        "current",
        unary!(delta, compare_texts, compare(&|r| r.current = CONTROL_BLANK.into())),
    );

    // --- debate
    const SOLVE: &str = "debate.Solve";
    let solve = |problem: &str, solvers: Vec<db::Solver>| db::SolveRequest { problem: problem.into(), solvers };
    t.invalid(SOLVE, Empty, "problem", unary!(debate, solve, solve("", vec![])));
    t.invalid(SOLVE, ControlChars, "problem", unary!(debate, solve, solve(CONTROL_BLANK, vec![])));
    t.invalid(SOLVE, OutOfRange, "solvers", unary!(debate, solve, solve("What is 2 + 2?", solvers()[..2].to_vec())));
    t.invalid(
        SOLVE,
        DuplicateId,
        "solvers[1].id",
        unary!(
            debate,
            solve,
            solve("What is 2 + 2?", {
                let mut s = solvers();
                s[1].id = "s1".into();
                s
            })
        ),
    );
    t.invalid(
        SOLVE,
        Nan,
        "solvers[0].model.temperature",
        unary!(
            debate,
            solve,
            solve("What is 2 + 2?", {
                let mut s = solvers();
                s[0].model = spec(|m| m.temperature = Some(f64::NAN));
                s
            })
        ),
    );
    const REVIEW: &str = "debate.Review";
    let review = |f: &dyn Fn(&mut db::ReviewRequest)| {
        let mut r = db::ReviewRequest { problem: "What is 2 + 2?".into(), solvers: solvers(), solutions: solutions() };
        f(&mut r);
        r
    };
    t.invalid(
        REVIEW,
        Nan,
        "solutions[0].confidence",
        unary!(debate, review, review(&|r| r.solutions[0].confidence = f64::NAN)),
    );
    t.invalid(
        REVIEW,
        DuplicateId,
        "solutions[2].solver_id",
        unary!(debate, review, review(&|r| r.solutions[2].solver_id = "s1".into())),
    );
    const REFINE: &str = "debate.RefineSolutions";
    let refine = |f: &dyn Fn(&mut db::RefineSolutionsRequest)| {
        let mut r = db::RefineSolutionsRequest {
            problem: "What is 2 + 2?".into(),
            solvers: solvers(),
            solutions: solutions(),
            reviews: reviews(),
        };
        f(&mut r);
        r
    };
    t.invalid(
        REFINE,
        DuplicateId,
        "reviews[0].target_solver_id",
        unary!(debate, refine_solutions, refine(&|r| r.reviews[0].target_solver_id = r.reviews[0].reviewer_id.clone())),
    );
    t.invalid(
        REFINE,
        UnknownEnum,
        "reviews[0].errors[0].severity",
        unary!(
            debate,
            refine_solutions,
            refine(&|r| r.reviews[0].errors =
                vec![db::SolutionError { severity: 9, description: "wrong sum".into(), ..Default::default() }])
        ),
    );
    const JUDGE_DEBATE: &str = "debate.JudgeDebate";
    let judge = |f: &dyn Fn(&mut db::JudgeDebateRequest)| {
        let mut r = db::JudgeDebateRequest {
            problem: "What is 2 + 2?".into(),
            solutions: solutions(),
            reviews: reviews(),
            refined: refined(),
            judge_model: None,
        };
        f(&mut r);
        r
    };
    t.invalid(
        JUDGE_DEBATE,
        Infinite,
        "refined[0].confidence",
        unary!(debate, judge_debate, judge(&|r| r.refined[0].confidence = f64::INFINITY)),
    );
    t.invalid(
        JUDGE_DEBATE,
        OutOfRange,
        "judge_model.max_tokens",
        unary!(debate, judge_debate, judge(&|r| r.judge_model = spec(|s| s.max_tokens = Some(0)))),
    );
    const RUN_DEBATE: &str = "debate.RunDebate";
    t.invalid(RUN_DEBATE, OutOfRange, "rounds", unary!(debate, run_debate, run_debate(|r| r.rounds = Some(6))));
    t.invalid(RUN_DEBATE, Huge, "problem", unary!(debate, run_debate, run_debate(|r| r.problem = huge_text())));
    t.invalid(
        RUN_DEBATE,
        ControlChars,
        "judge_model.backend",
        unary!(debate, run_debate, run_debate(|r| r.judge_model = spec(|s| s.backend = CONTROL_BACKEND.into()))),
    );
    const RUN_DEBATE_STREAM: &str = "debate.RunDebateStream";
    t.invalid(
        RUN_DEBATE_STREAM,
        Empty,
        "request",
        streaming!(debate, run_debate_stream, db::RunDebateStreamRequest { request: None }),
    );
    t.invalid(
        RUN_DEBATE_STREAM,
        Huge,
        "request.solvers[0].persona",
        streaming!(
            debate,
            run_debate_stream,
            db::RunDebateStreamRequest {
                request: Some(run_debate(|r| {
                    r.solvers = solvers();
                    r.solvers[0].persona = "p".repeat(4096);
                }))
            }
        ),
    );
    t.invalid(
        RUN_DEBATE_STREAM,
        InvalidUtf8,
        "request.problem",
        raw(
            &ch.debate,
            "/assay.debate.v1.DebateService/RunDebateStream",
            corrupt(&db::RunDebateStreamRequest { request: Some(run_debate(|r| r.problem = MARK.into())) }),
            true,
        ),
    );
    // --- an unknown backend (a name with control characters) is refused before any call, wherever
    // a model spec is taken
    t.invalid(
        EVALUATE,
        ControlChars,
        "pipeline.scorer_model.backend",
        unary!(gateway, evaluate, evaluate(|p| p.scorer_model = spec(|s| s.backend = CONTROL_BACKEND.into()))),
    );
    t.invalid(
        CORPUS,
        ControlChars,
        "model.backend",
        unary!(generator, generate_corpus, corpus(|r| r.model = spec(|s| s.backend = CONTROL_BACKEND.into()))),
    );
    t.invalid(
        TAG,
        ControlChars,
        "model.backend",
        unary!(
            refiners,
            tag,
            rf::TagRequest { items: items(), model: spec(|s| s.backend = CONTROL_BACKEND.into()), concurrency: 0 }
        ),
    );
    t.invalid(
        SELECT,
        ControlChars,
        "embedding_model.backend",
        unary!(refiners, select, select(&|r| r.embedding_model = spec(|s| s.backend = CONTROL_BACKEND.into()))),
    );
    // A draft too short to refine makes no call, and the spec is still checked.
    t.invalid(
        SELF_REFINE,
        ControlChars,
        "model.backend",
        unary!(
            refiners,
            self_refine,
            rf::SelfRefineRequest {
                draft: "short".into(),
                model: spec(|s| s.backend = CONTROL_BACKEND.into()),
                ..Default::default()
            }
        ),
    );
    t.invalid(
        PATCH,
        ControlChars,
        "model.backend",
        unary!(refiners, patch, patch(|r| r.model = spec(|s| s.backend = CONTROL_BACKEND.into()))),
    );
    t.invalid(
        JUDGE,
        ControlChars,
        "judges[0].model.backend",
        unary!(
            scorer,
            judge_sections,
            judge_sections(|r| r.judges =
                vec![sc::PanelJudge { id: "j".into(), model: spec(|s| s.backend = CONTROL_BACKEND.into()) }])
        ),
    );
    t.invalid(
        CONSOLIDATE,
        ControlChars,
        "model.backend",
        unary!(
            arbiter,
            consolidate,
            consolidate(|r| {
                r.skip_synthesis = false;
                r.model = spec(|s| s.backend = CONTROL_BACKEND.into());
            })
        ),
    );
    t.invalid(
        VERIFY,
        ControlChars,
        "model.backend",
        unary!(delta, verify, verify_request(|r| r.model = spec(|s| s.backend = CONTROL_BACKEND.into()))),
    );
    t.invalid(
        COMPARE,
        ControlChars,
        "embedding_model.backend",
        unary!(
            delta,
            compare_texts,
            compare(&|r| {
                r.previous = "The cat sat on the mat today.".into();
                r.current = "A dog lay on the rug this morning.".into();
                r.embedding_model = spec(|s| s.backend = CONTROL_BACKEND.into());
            })
        ),
    );
    t.invalid(
        SOLVE,
        ControlChars,
        "solvers[0].model.backend",
        unary!(
            debate,
            solve,
            solve("What is 2 + 2?", {
                let mut s = solvers();
                s[0].model = spec(|m| m.backend = CONTROL_BACKEND.into());
                s
            })
        ),
    );
    // --- more limits
    t.invalid(
        SCORE,
        Huge,
        "checklist.items[0].id",
        unary!(scorer, score, score(|r| r.checklist.as_mut().unwrap().items[0].id = "i".repeat(1024))),
    );
    t.invalid(SCORE, Huge, "targets[0].history", unary!(scorer, score, score(|r| r.targets[0].history = huge_text())));
    t.invalid(
        LIST,
        OutOfRange,
        "page_token",
        unary!(
            gateway,
            list_runs,
            gw::ListRunsRequest { page_token: "99999999999999999999999:x".into(), ..Default::default() }
        ),
    );
    t
}

struct Channels {
    gateway: Channel,
    generator: Channel,
    refiners: Channel,
    scorer: Channel,
    arbiter: Channel,
    delta_judge: Channel,
    debate: Channel,
}

/// Whether `outcome` is what `case` expects; why not otherwise.
fn judge(case: &Expect, outcome: Outcome) -> Result<(), String> {
    let status = match outcome {
        Ok(()) => return Err("accepted".into()),
        Err(s) => s,
    };
    if status.code() != case.code {
        return Err(format!("{:?}: {}", status.code(), status.message()));
    }
    if case.code == Code::InvalidArgument {
        let bad =
            status.get_details_bad_request().ok_or_else(|| format!("no BadRequest details: {}", status.message()))?;
        let fields: Vec<&str> = bad.field_violations.iter().map(|v| v.field.as_str()).collect();
        if !fields.contains(&case.field.as_str()) {
            return Err(format!("violations name {fields:?}"));
        }
    }
    if !status.message().contains(case.field.as_str()) {
        return Err(format!("the message does not name {:?}: {}", case.field, status.message()));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_refuses_malformed_requests_naming_the_field() {
    count_panics();
    let panics_before = panics().len();
    let sandbox = MeshSandbox::start().await;
    let addrs = sandbox.mesh().addrs;
    let ch = Channels {
        gateway: sandbox.channel(addrs.gateway).await,
        generator: sandbox.channel(addrs.generator).await,
        refiners: sandbox.channel(addrs.refiners).await,
        scorer: sandbox.channel(addrs.scorer).await,
        arbiter: sandbox.channel(addrs.arbiter).await,
        delta_judge: sandbox.channel(addrs.delta_judge).await,
        debate: sandbox.channel(addrs.debate).await,
    };
    let cases = table(&ch).cases;
    let total = cases.len();
    let mut failures = Vec::new();
    let mut by_rpc: BTreeMap<&str, usize> = BTreeMap::new();
    let mut by_kind: BTreeMap<Kind, usize> = BTreeMap::new();
    for (i, Case { expect, call }) in cases.into_iter().enumerate() {
        *by_rpc.entry(expect.rpc).or_default() += 1;
        *by_kind.entry(expect.kind).or_default() += 1;
        let calls_before = sandbox.llm.request_count();
        let outcome = match tokio::time::timeout(Duration::from_secs(30), call).await {
            Ok(o) => o,
            Err(_) => Err(Status::deadline_exceeded("no answer in 30 s")),
        };
        let calls = sandbox.llm.request_count() - calls_before;
        let verdict = judge(&expect, outcome)
            .and_then(|()| if calls == 0 { Ok(()) } else { Err(format!("{calls} model calls")) });
        if let Err(why) = verdict {
            let Expect { rpc, kind, code, field } = expect;
            failures.push(format!("#{i} {rpc} {kind:?} {field:?} ({code:?}): {why}"));
        }
    }
    println!("bad-input corpus: {total} cases, {} failed", failures.len());
    for (rpc, n) in &by_rpc {
        println!("  {rpc}: {n}");
    }
    for (kind, n) in &by_kind {
        println!("  {kind:?}: {n}");
    }
    assert!(failures.is_empty(), "{} of {total} cases failed:\n{}", failures.len(), failures.join("\n"));
    assert!(total >= 80, "the corpus has {total} cases");
    assert_eq!(sandbox.llm.request_count(), 0, "no model was called");
    // Nothing died: every service still answers health with SERVING.
    for (name, addr) in addrs.all() {
        let mut health = HealthClient::new(sandbox.channel(addr).await);
        let s = health.check(HealthCheckRequest { service: name.into() }).await.unwrap().into_inner();
        assert_eq!(s.status, ServingStatus::Serving as i32, "{name}");
    }
    let panics = panics();
    assert_eq!(panics.len(), panics_before, "panics: {:?}", &panics[panics_before..]);
    sandbox.shutdown().await.unwrap();
}
