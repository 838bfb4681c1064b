//! Every stage error crosses a real gRPC hop (a server on loopback port 0 answering through
//! `run_with`, and the remote client the gateway holds) as the same value: its reason travels in
//! `google.rpc.ErrorInfo`, so a remote stage's budget refusal is the same value as a local one and
//! no caller reads the message to tell what happened.

use std::sync::{Arc, Mutex};

use assay_budget::{Budget, Cost, Limits};
use assay_domain::arbiter::{Arbiter, RouteRequest};
use assay_domain::{BudgetRefusal, Exhaustion, FieldViolation, Reason, StageError};
use assay_proto::arbiter::v1 as pb;
use assay_proto::arbiter::v1::arbiter_service_server::{ArbiterService, ArbiterServiceServer};
use assay_rpc::remote::RemoteArbiter;
use assay_rpc::{CallContext, Readiness, ServeOptions, run_with, serve};
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

/// An arbiter whose Route fails with the error set, or, with none set, makes a model call
/// reservation the caller's budget cannot pay for.
#[derive(Clone, Default)]
struct Failing(Arc<Mutex<Option<StageError>>>);

#[tonic::async_trait]
impl ArbiterService for Failing {
    async fn compute_agreement(
        &self,
        _: Request<pb::ComputeAgreementRequest>,
    ) -> Result<Response<pb::ComputeAgreementResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn consolidate(
        &self,
        _: Request<pb::ConsolidateRequest>,
    ) -> Result<Response<pb::ConsolidateResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn route(&self, request: Request<pb::RouteRequest>) -> Result<Response<pb::RouteResponse>, Status> {
        let error = self.0.lock().unwrap().clone();
        run_with(CallContext::from_request(&request), async move {
            if let Some(e) = error {
                return Err(e);
            }
            let budget = assay_budget::current().expect("a budget while serving");
            let _hold = budget.reserve(Cost::new(1_000, 0)).await?;
            Ok(pb::RouteResponse::default())
        })
        .await
        .map(Response::new)
    }

    async fn plan(&self, _: Request<pb::PlanRequest>) -> Result<Response<pb::PlanResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
}

async fn start() -> (RemoteArbiter, Failing) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let readiness = Readiness::new(&["assay.arbiter.v1.ArbiterService"]).await;
    readiness.set_serving().await;
    let failing = Failing::default();
    let routes = tonic::service::Routes::new(ArbiterServiceServer::new(failing.clone()));
    tokio::spawn(serve(listener, routes, readiness, ServeOptions::default(), std::future::pending()));
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect_lazy();
    (RemoteArbiter::new(channel, None), failing)
}

#[tokio::test]
async fn every_reason_comes_back_as_the_same_error() {
    let (remote, failing) = start().await;
    let errors = [
        StageError::InvalidArgument(vec![
            FieldViolation::new("issues[0].section_id", "must not be empty"),
            FieldViolation::new("sections", "has 0 sections"),
        ]),
        StageError::NotFound("section s9".into()),
        StageError::FailedPrecondition("model backend refused credentials: http 401".into()),
        StageError::ResourceExhausted("the gateway is full".into()),
        StageError::RateLimited("model backend rate limited: http 429".into()),
        StageError::BudgetExhausted(BudgetRefusal::spent("budget exhausted: $0.0200 of $0.0100 spent")),
        StageError::BudgetExhausted(BudgetRefusal::unpriced("budget exhausted: model \"m\" has no price")),
        StageError::Unavailable("model backend unavailable: http 503".into()),
        StageError::CircuitOpen("model backend unavailable: circuit open".into()),
        StageError::DeadlineExceeded("model call ran out of time".into()),
        StageError::Cancelled("the run was cancelled".into()),
        StageError::Unimplemented("no such pipeline".into()),
        StageError::Internal("a bug".into()),
    ];
    let reasons: std::collections::HashSet<Reason> = errors.iter().map(StageError::reason).collect();
    assert_eq!(reasons.len(), Reason::ALL.len(), "one error of every reason");
    for e in errors {
        *failing.0.lock().unwrap() = Some(e.clone());
        let got = remote.route(RouteRequest::default()).await.expect_err("the stage fails");
        assert_eq!(got, e, "{} came back as {got:?}", e.reason());
    }
}

#[tokio::test]
async fn a_budget_refusal_says_why_without_text_and_what_it_needed() {
    let (remote, failing) = start().await;
    // Any message: the reason, not the text, makes it a budget refusal.
    *failing.0.lock().unwrap() = Some(StageError::BudgetExhausted(BudgetRefusal::spent("nothing to see here")));
    let got = remote.route(RouteRequest::default()).await.unwrap_err();
    assert!(matches!(&got, StageError::BudgetExhausted(r) if r.cause == Exhaustion::Spent), "{got:?}");
    assert_eq!(got.reason(), Reason::BudgetExhausted);

    // A stage whose model call the slice it was given cannot pay for: refused there, the same
    // value here, and the caller's budget learns what the call needed (the need header).
    *failing.0.lock().unwrap() = None;
    let budget = Budget::new(Limits { max_tokens: Some(100), max_cost_usd: None });
    let got = assay_budget::scope(budget.clone(), remote.route(RouteRequest::default())).await.unwrap_err();
    let StageError::BudgetExhausted(refusal) = &got else { panic!("not a budget refusal: {got:?}") };
    assert_eq!(refusal.cause, Exhaustion::Spent);
    assert!(refusal.message.starts_with("budget exhausted: a call needs up to 1000 tokens"), "{refusal}");
    assert_eq!(budget.refused_need().map(|c| c.tokens), Some(1_000));
}
