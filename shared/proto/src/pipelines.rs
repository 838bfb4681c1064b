//! The pipeline registry of the contract: each pipeline kind registers, once, its kind, its name,
//! its request message (a variant of `RunPipelineRequest.pipeline`) and its result message (a
//! variant of `RunResult.result`). Code that needs one kind's request or result asks its
//! [`PipelineContract`] instead of matching over every kind; code that needs the kind of any
//! request or result asks [`kind_of`] / [`result_kind`]. A new pipeline adds one entry here.

use crate::gateway::v1 as gw;
use crate::gateway::v1::run_pipeline_request::Pipeline as Request;
use crate::gateway::v1::run_result::Result as Outcome;

/// One pipeline kind's contract: its request and result messages, read out of the oneofs.
pub trait PipelineContract {
    /// The pipeline's request message.
    type Request;
    /// The pipeline's result message.
    type Result;
    /// Its kind.
    const KIND: gw::PipelineKind;
    /// Its name in requests and on the command line (`checklist_eval`).
    const NAME: &'static str;
    /// The pipeline's request, if `request` is one.
    fn request(request: Request) -> Option<Self::Request>;
    /// `request` as a `RunPipelineRequest.pipeline`.
    fn wrap_request(request: Self::Request) -> Request;
    /// The pipeline's result, if `result` is one.
    fn result(result: Outcome) -> Option<Self::Result>;
    /// `result` as a `RunResult.result`.
    fn wrap_result(result: Self::Result) -> Outcome;
}

/// The result of kind `C` a finished run holds, if it holds one.
pub fn result_of<C: PipelineContract>(result: Option<gw::RunResult>) -> Option<C::Result> {
    result.and_then(|r| r.result).and_then(C::result)
}

macro_rules! registry {
    ($($(#[$doc:meta])* $marker:ident: $kind:ident $name:literal, request $req:ident($req_ty:ty), result $res:ident($res_ty:ty);)*) => {
        $(
            $(#[$doc])*
            #[derive(Debug, Clone, Copy, PartialEq, Eq)]
            pub struct $marker;

            impl PipelineContract for $marker {
                type Request = $req_ty;
                type Result = $res_ty;
                const KIND: gw::PipelineKind = gw::PipelineKind::$kind;
                const NAME: &'static str = $name;
                fn request(request: Request) -> Option<Self::Request> {
                    if let Request::$req(r) = request { Some(r) } else { None }
                }
                fn wrap_request(request: Self::Request) -> Request {
                    Request::$req(request)
                }
                fn result(result: Outcome) -> Option<Self::Result> {
                    if let Outcome::$res(r) = result { Some(r) } else { None }
                }
                fn wrap_result(result: Self::Result) -> Outcome {
                    Outcome::$res(result)
                }
            }
        )*

        /// The kind of a request's pipeline.
        pub fn kind_of(request: &Request) -> gw::PipelineKind {
            match request {
                $(Request::$req(_) => gw::PipelineKind::$kind,)*
            }
        }

        /// The kind of pipeline a result comes from.
        pub fn result_kind(result: &Outcome) -> gw::PipelineKind {
            match result {
                $(Outcome::$res(_) => gw::PipelineKind::$kind,)*
            }
        }

        /// Every registered kind with its name, in registration order.
        pub const KINDS: &[(gw::PipelineKind, &str)] = &[$((gw::PipelineKind::$kind, $name),)*];
    };
}

registry! {
    /// Score records against checklists (one per input, given, or from a corpus).
    ChecklistEval: ChecklistEval "checklist_eval",
        request ChecklistEval(gw::ChecklistEvalPipeline), result ChecklistEval(gw::EvaluateResponse);
    /// Generate (and refine) a checklist.
    GenerateChecklist: GenerateChecklist "generate_checklist",
        request GenerateChecklist(gw::GenerateChecklistPipeline), result Checklist(crate::common::v1::Checklist);
    /// Judge, plan, patch and verify a document, iteration after iteration.
    TargetedRefinement: TargetedRefinement "targeted_refinement",
        request TargetedRefinement(gw::TargetedRefinementPipeline),
        result TargetedRefinement(gw::TargetedRefinementResult);
    /// Critique and revise a text until it stops improving.
    SelfRefine: SelfRefine "self_refine",
        request SelfRefine(gw::SelfRefinePipeline), result SelfRefine(crate::refiners::v1::SelfRefineResponse);
    /// Multi-model debate over problems.
    Debate: Debate "debate", request Debate(gw::DebatePipeline), result Debate(gw::DebateRunResult);
}

/// The names of every registered kind, for messages (`checklist_eval, ..., or debate`).
pub fn kind_names() -> String {
    let names: Vec<&str> = KINDS.iter().map(|(_, n)| *n).collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        Some((last, _)) => (*last).to_string(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_registered_once_and_reads_back_its_own_request_and_result() {
        let kinds: Vec<i32> = KINDS.iter().map(|(k, _)| *k as i32).collect();
        let mut unique = kinds.clone();
        unique.dedup();
        assert_eq!(kinds, unique);
        // Every PipelineKind but UNSPECIFIED has an entry.
        let all = (1..).map_while(|n| gw::PipelineKind::try_from(n).ok()).count();
        assert_eq!(KINDS.len(), all);
        let request = ChecklistEval::wrap_request(gw::ChecklistEvalPipeline::default());
        assert_eq!(kind_of(&request), gw::PipelineKind::ChecklistEval);
        assert!(Debate::request(request.clone()).is_none());
        assert!(ChecklistEval::request(request).is_some());
        let result = Debate::wrap_result(gw::DebateRunResult::default());
        assert_eq!(result_kind(&result), gw::PipelineKind::Debate);
        assert!(SelfRefine::result(result.clone()).is_none());
        let run = gw::RunResult { result: Some(result), error: String::new() };
        assert!(result_of::<Debate>(Some(run)).is_some());
        assert_eq!(kind_names(), "checklist_eval, generate_checklist, targeted_refinement, self_refine or debate");
    }
}
