//! One Evaluate call through the mesh, exported over OTLP to a collector in this process (a real
//! OTLP/gRPC TraceService on loopback): the spans of the gateway, the generator and the scorer
//! form one trace with correct parent links, every model call is a client span with the
//! OpenTelemetry GenAI attributes, and the model server received the trace's `traceparent`.
//! Its own test binary: the tracing subscriber is global to the process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_proto::generator::v1::Preset;
use assay_testkit::schema_reply;
use assay_tests::MeshSandbox;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
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
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = collector.clone();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(server))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
    });
    let telemetry = assay_telemetry::init_with("assay-otlp-test", Some(&format!("http://{addr}")));

    let sandbox = MeshSandbox::start().await;
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
    let reply = client.evaluate(gw::EvaluateRequest { pipeline: Some(pipeline) }).await.expect("evaluate").into_inner();
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
}
