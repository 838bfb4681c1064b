//! One Evaluate call through the mesh, exported over OTLP to a collector in this process (a real
//! OTLP/gRPC TraceService and MetricsService on loopback): the spans of the gateway, the generator
//! and the scorer form one trace with correct parent links, every model call is a client span with
//! the OpenTelemetry GenAI attributes, and the model server received the trace's `traceparent`.
//! Then the metrics: per-RPC durations, model calls, tokens, cache hits, retries, the backend's
//! concurrency limit and breaker, and runs by state, with the values the calls made.
//! Its own test binary: the tracing subscriber and the meter provider are global to the process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_proto::generator::v1::Preset;
use assay_testkit::schema_reply;
use assay_tests::{MeshSandbox, SandboxOptions};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::metrics::v1::{Metric, metric::Data, number_data_point};
use opentelemetry_proto::tonic::trace::v1::Span;

#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<Span>>>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans = request.into_inner().resource_spans.into_iter().flat_map(|r| r.scope_spans).flat_map(|s| s.spans);
        self.0.lock().unwrap().extend(spans);
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

#[derive(Clone, Default)]
struct MetricCollector(Arc<Mutex<Vec<ExportMetricsServiceRequest>>>);

#[tonic::async_trait]
impl MetricsService for MetricCollector {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.0.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse { partial_success: None }))
    }
}

/// One data point of a metric: its attributes (as text) and its value (count for histograms,
/// sum for the token histogram's `sum`).
#[derive(Debug, Clone)]
struct Point {
    attrs: HashMap<String, String>,
    value: f64,
    sum: f64,
}

fn attrs_of(kvs: &[KeyValue]) -> HashMap<String, String> {
    kvs.iter()
        .map(|kv| {
            let v = match kv.value.as_ref().and_then(|v| v.value.clone()) {
                Some(Value::StringValue(s)) => s,
                Some(Value::IntValue(i)) => i.to_string(),
                Some(Value::BoolValue(b)) => b.to_string(),
                Some(Value::DoubleValue(d)) => d.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), v)
        })
        .collect()
}

fn number(v: Option<number_data_point::Value>) -> f64 {
    match v {
        Some(number_data_point::Value::AsInt(i)) => i as f64,
        Some(number_data_point::Value::AsDouble(d)) => d,
        None => f64::NAN,
    }
}

/// The points of metric `name` in the collected exports (cumulative: the last export wins).
fn points(exports: &[ExportMetricsServiceRequest], name: &str) -> Vec<Point> {
    let metric: Option<&Metric> = exports
        .iter()
        .rev()
        .flat_map(|e| e.resource_metrics.iter().flat_map(|r| r.scope_metrics.iter().flat_map(|s| s.metrics.iter())))
        .find(|m| m.name == name);
    let Some(data) = metric.and_then(|m| m.data.clone()) else {
        return Vec::new();
    };
    match data {
        Data::Histogram(h) => h
            .data_points
            .iter()
            .map(|p| Point { attrs: attrs_of(&p.attributes), value: p.count as f64, sum: p.sum.unwrap_or(f64::NAN) })
            .collect(),
        Data::Sum(s) => s
            .data_points
            .iter()
            .map(|p| Point { attrs: attrs_of(&p.attributes), value: number(p.value), sum: f64::NAN })
            .collect(),
        Data::Gauge(g) => g
            .data_points
            .iter()
            .map(|p| Point { attrs: attrs_of(&p.attributes), value: number(p.value), sum: f64::NAN })
            .collect(),
        other @ (Data::ExponentialHistogram(_) | Data::Summary(_)) => panic!("{name}: unexpected data {other:?}"),
    }
}

/// Total of the points of `name` whose attributes include every pair of `with`.
fn total(exports: &[ExportMetricsServiceRequest], name: &str, with: &[(&str, &str)]) -> f64 {
    points(exports, name)
        .iter()
        .filter(|p| with.iter().all(|(k, v)| p.attrs.get(*k).map(String::as_str) == Some(*v)))
        .map(|p| p.value)
        .sum()
}

fn attr(span: &Span, key: &str) -> Option<Value> {
    span.attributes.iter().find(|a| a.key == key).and_then(|a| a.value.as_ref()?.value.clone())
}

fn text(span: &Span, key: &str) -> String {
    match attr(span, key) {
        Some(Value::StringValue(s)) => s,
        _ => String::new(),
    }
}

fn int(span: &Span, key: &str) -> i64 {
    match attr(span, key) {
        Some(Value::IntValue(i)) => i,
        _ => -1,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn one_evaluate_is_one_trace_across_every_hop_with_genai_model_spans() {
    let collector = Collector::default();
    let metric_collector = MetricCollector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = collector.clone();
    let metric_server = metric_collector.clone();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(server))
            .add_service(MetricsServiceServer::new(metric_server))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
    });
    let telemetry = assay_telemetry::init_with("assay-otlp-test", Some(&format!("http://{addr}")));

    // The response cache on, so that a repeated call is a cache hit in the metrics.
    let sandbox = MeshSandbox::start_with(SandboxOptions { cache: true, ..Default::default() }).await;
    sandbox.llm.set_handler(|r| schema_reply(r).usage(120, 30));
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let records = (0..2)
        .map(|i| gw::EvalRecord {
            id: format!("r{i}"),
            input: format!("Write a haiku about rain number {i}."),
            target: "Rain on the window.".into(),
            ..Default::default()
        })
        .collect();
    let pipeline = gw::ChecklistEvalPipeline {
        source: Some(gw::ChecklistSource { source: Some(gw::checklist_source::Source::Preset(Preset::Tick as i32)) }),
        records,
        ..Default::default()
    };
    let reply = client
        .evaluate(gw::EvaluateRequest { pipeline: Some(pipeline.clone()), budget: None })
        .await
        .expect("evaluate")
        .into_inner();
    assert_eq!(reply.results.len(), 2);

    // Export, then wait for the collector to hold the model-call spans and the Evaluate span (which
    // ends once the reply is sent).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        telemetry.flush();
        let (chats, evaluate) = {
            let spans = collector.0.lock().unwrap();
            (
                spans.iter().filter(|s| s.name.starts_with("chat ")).count(),
                spans.iter().any(|s| text(s, "path").ends_with("/Evaluate")),
            )
        };
        if (chats >= 4 && evaluate) || tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let spans = collector.0.lock().unwrap().clone();
    let path = |s: &Span| text(s, "path");
    let evaluate = spans.iter().find(|s| path(s) == "/assay.gateway.v1.GatewayService/Evaluate").unwrap_or_else(|| {
        panic!("the gateway's Evaluate span: {:?}", spans.iter().map(|s| &s.name).collect::<Vec<_>>())
    });
    let trace = evaluate.trace_id.clone();
    let by_id: HashMap<Vec<u8>, &Span> = spans.iter().map(|s| (s.span_id.clone(), s)).collect();
    // Every span's parent chain, within the trace, up to the Evaluate span.
    let descends_from_evaluate = |s: &Span| {
        let mut cur = s;
        for _ in 0..64 {
            if cur.span_id == evaluate.span_id {
                return true;
            }
            match by_id.get(&cur.parent_span_id) {
                Some(p) => cur = p,
                None => return false,
            }
        }
        false
    };
    for service in ["/assay.generator.v1.GeneratorService/Generate", "/assay.scorer.v1.ScorerService/Score"] {
        let hop: Vec<&Span> = spans.iter().filter(|s| path(s) == service).collect();
        assert!(!hop.is_empty(), "a server span for {service}");
        for s in hop {
            assert_eq!(s.kind, 2, "{service}: a server span (SPAN_KIND_SERVER)");
            assert_eq!(text(s, "rpc.system"), "grpc");
            assert_eq!(format!("/{}/{}", text(s, "rpc.service"), text(s, "rpc.method")), service);
            assert_eq!(s.trace_id, trace, "{service} is in the Evaluate call's trace");
            assert!(descends_from_evaluate(s), "{service}'s span descends from the gateway's Evaluate span");
        }
    }
    let chats: Vec<&Span> = spans.iter().filter(|s| s.name.starts_with("chat ")).collect();
    assert!(chats.len() >= 4, "a span per model call (2 generations + 2 scorings): {}", chats.len());
    for c in &chats {
        assert_eq!(c.trace_id, trace, "model calls are in the trace");
        assert!(descends_from_evaluate(c), "a model call descends from the Evaluate span");
        assert_eq!(c.kind, 3, "model calls are client spans (SPAN_KIND_CLIENT)");
        assert_eq!(text(c, "gen_ai.operation.name"), "chat");
        assert_eq!(text(c, "gen_ai.provider.name"), "openai");
        assert_eq!(text(c, "gen_ai.request.model"), "scripted-judge");
        assert!(!text(c, "gen_ai.response.model").is_empty());
        assert_eq!(text(c, "server.address"), "127.0.0.1");
        assert_eq!(int(c, "gen_ai.usage.input_tokens"), 120, "input tokens as the server reported them");
        assert_eq!(int(c, "gen_ai.usage.output_tokens"), 30, "output tokens as the server reported them");
    }
    // The model server joined the trace: every chat request carried its traceparent.
    let trace_hex: String = trace.iter().map(|b| format!("{b:02x}")).collect();
    let chat_requests: Vec<_> = sandbox.llm.requests().into_iter().filter(|r| r.is_chat()).collect();
    assert!(!chat_requests.is_empty());
    for r in chat_requests {
        let tp = r.headers.get("traceparent").cloned().unwrap_or_default();
        assert!(tp.starts_with(&format!("00-{trace_hex}-")), "traceparent {tp:?} carries trace {trace_hex}");
    }
    eprintln!(
        "{} spans in trace {trace_hex}: {} model calls",
        spans.iter().filter(|s| s.trace_id == trace).count(),
        chats.len()
    );

    // Metrics. The same call again: its deterministic model calls (the judge's, at temperature 0)
    // come from the cache, the sampled ones (generation) go to the backend again. Then one new
    // record whose first model call meets a 503 and is retried.
    let backend_calls = |llm: &assay_testkit::ScriptedLlm| llm.requests().into_iter().filter(|r| r.is_chat()).count();
    let first_calls = backend_calls(&sandbox.llm);
    client
        .evaluate(gw::EvaluateRequest { pipeline: Some(pipeline.clone()), budget: None })
        .await
        .expect("evaluate again");
    let cached_calls = first_calls - (backend_calls(&sandbox.llm) - first_calls);
    assert!(cached_calls >= 2, "the repeated call's judge calls are answered from the cache: {cached_calls}");
    sandbox.llm.push(assay_testkit::Reply::status(503));
    let mut third = pipeline;
    third.records = vec![gw::EvalRecord {
        id: "r9".into(),
        input: "Write a limerick about snow.".into(),
        target: "Snow fell.".into(),
        ..Default::default()
    }];
    client.evaluate(gw::EvaluateRequest { pipeline: Some(third), budget: None }).await.expect("evaluate with a retry");
    let all_calls = backend_calls(&sandbox.llm);
    let answered = all_calls - 1; // less the 503

    metric_collector.0.lock().unwrap().clear();
    telemetry.flush();
    let exports = metric_collector.0.lock().unwrap().clone();
    assert!(!exports.is_empty(), "a flush exports the metrics");
    let names: std::collections::BTreeSet<String> = exports
        .iter()
        .flat_map(|e| e.resource_metrics.iter().flat_map(|r| r.scope_metrics.iter().flat_map(|s| s.metrics.iter())))
        .map(|m| m.name.clone())
        .collect();
    eprintln!("metrics exported: {names:?}");

    // Per-RPC durations, to the end of each call, by service, method and status.
    let rpc = |service: &str, method: &str| {
        total(
            &exports,
            "rpc.server.call.duration",
            &[("rpc.service", service), ("rpc.method", method), ("rpc.grpc.status_code", "0")],
        )
    };
    assert_eq!(rpc("assay.gateway.v1.GatewayService", "Evaluate"), 3.0, "three Evaluate calls, all OK");
    assert!(rpc("assay.generator.v1.GeneratorService", "Generate") >= 2.0, "the generator's calls");
    assert!(rpc("assay.scorer.v1.ScorerService", "Score") >= 2.0, "the scorer's calls");

    // Model calls, per backend and phase.
    let ok_calls = total(&exports, "assay.llm.calls", &[("assay.backend", "openai"), ("assay.outcome", "ok")]);
    assert_eq!(ok_calls, answered as f64, "every answered backend call, once");
    let phases: std::collections::BTreeSet<String> =
        points(&exports, "assay.llm.calls").iter().filter_map(|p| p.attrs.get("assay.phase").cloned()).collect();
    assert!(phases.len() >= 2, "calls are told apart by phase (generation, scoring): {phases:?}");
    let cache_hits = total(&exports, "assay.llm.cache.hits", &[("assay.backend", "openai")]);
    assert_eq!(cache_hits, cached_calls as f64, "the repeated call's cached model calls, each counted");
    let durations = total(&exports, "gen_ai.client.operation.duration", &[("gen_ai.operation.name", "chat")]);
    assert_eq!(durations, answered as f64, "a duration per backend call (cache hits excluded)");
    let tokens = |kind: &str| {
        points(&exports, "gen_ai.client.token.usage")
            .iter()
            .filter(|p| p.attrs.get("gen_ai.token.type").map(String::as_str) == Some(kind))
            .map(|p| p.sum)
            .sum::<f64>()
    };
    assert_eq!(tokens("input"), 120.0 * answered as f64, "input tokens as the server reported them");
    assert_eq!(tokens("output"), 30.0 * answered as f64, "output tokens as the server reported them");
    let retries =
        total(&exports, "assay.llm.retries", &[("assay.backend", "openai"), ("assay.retry.reason", "server_error")]);
    assert_eq!(retries, 1.0, "the 503 was retried once");

    // The backend's state, observed at export.
    let limit = total(&exports, "assay.llm.concurrency.limit", &[("assay.backend", "openai")]);
    assert!(limit >= 1.0, "the concurrency limit is reported: {limit}");
    assert_eq!(total(&exports, "assay.llm.concurrency.in_flight", &[("assay.backend", "openai")]), 0.0);
    let breaker = points(&exports, "assay.llm.breaker.state");
    assert!(
        breaker.iter().any(|p| p.attrs.get("assay.backend").map(String::as_str) == Some("openai") && p.value == 0.0),
        "the breaker is reported closed: {breaker:?}"
    );

    // Runs by state: every state reported, none left running.
    let runs = points(&exports, "assay.runs");
    assert_eq!(runs.len(), 8, "every run state is reported: {runs:?}");
    assert_eq!(total(&exports, "assay.runs", &[("assay.run.state", "running")]), 0.0);
    assert_eq!(total(&exports, "assay.runs.executing", &[]), 0.0, "nothing executes after the calls");
    eprintln!("metrics: {answered} backend calls, {cache_hits} cache hits, {retries} retry, concurrency limit {limit}");
}
