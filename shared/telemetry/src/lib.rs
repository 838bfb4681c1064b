//! One tracing init per binary: lowercase structured logs to stderr, OTLP trace and metric export
//! only when `OTEL_EXPORTER_OTLP_ENDPOINT` is set, and W3C trace-context propagation helpers for
//! every hop.
//!
//! Metrics go through the global meter ([`meter`]): without an endpoint it is a no-op, so the
//! instruments in the services cost next to nothing when nobody collects them. The export interval
//! is `OTEL_METRIC_EXPORT_INTERVAL` (milliseconds, default 60000), as the OpenTelemetry SDKs read it.

mod escaped;

pub use escaped::{EscapedStderr, escape_line};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Keeps the exporters alive; flushes spans and metrics on drop.
pub struct TelemetryGuard {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
    meters: Option<opentelemetry_sdk::metrics::SdkMeterProvider>,
}

impl TelemetryGuard {
    /// Export every finished span and the current value of every metric now.
    pub fn flush(&self) {
        if let Some(p) = &self.provider {
            let _ = p.force_flush();
        }
        if let Some(m) = &self.meters {
            let _ = m.force_flush();
        }
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            let _ = p.shutdown();
        }
        if let Some(m) = self.meters.take() {
            let _ = m.shutdown();
        }
    }
}

/// The meter every Assay instrument is created from (a no-op until [`init`] found an endpoint).
pub fn meter() -> opentelemetry::metrics::Meter {
    opentelemetry::global::meter("assay")
}

/// Histogram bucket boundaries, in seconds, for call durations (1 ms to 5 min).
pub const DURATION_BUCKETS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];

/// Initialise logging (and OTLP export when configured). `RUST_LOG` filters (default `info`),
/// `ASSAY_LOG_FORMAT=json` switches to JSON lines. Safe to call more than once (later calls no-op).
pub fn init(service_name: &str) -> TelemetryGuard {
    init_at(service_name, "info")
}

/// [`init`] with `default_filter` (e.g. `warn`) where `RUST_LOG` is unset.
pub fn init_at(service_name: &str, default_filter: &str) -> TelemetryGuard {
    let endpoint = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok().filter(|e| !e.is_empty());
    init_filtered(service_name, endpoint.as_deref(), default_filter)
}

/// [`init`] with the OTLP endpoint given (none: logs only), whatever the environment says.
pub fn init_with(service_name: &str, endpoint: Option<&str>) -> TelemetryGuard {
    init_filtered(service_name, endpoint, "info")
}

fn init_filtered(service_name: &str, endpoint: Option<&str>, default_filter: &str) -> TelemetryGuard {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let json = std::env::var("ASSAY_LOG_FORMAT").is_ok_and(|v| v.eq_ignore_ascii_case("json"));
    let fmt = if json {
        tracing_subscriber::fmt::layer().json().with_writer(std::io::stderr).boxed()
    } else {
        // Colour only on a terminal: a file or a pipe gets plain text.
        let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
        // Each line escaped: caller and model text in a field cannot forge a line.
        let writer = EscapedStderr { keep_escapes: ansi };
        tracing_subscriber::fmt::layer().with_writer(writer).with_target(false).with_ansi(ansi).boxed()
    };
    let (otel, provider) = match endpoint.and_then(|e| build_provider(service_name, e)) {
        Some(provider) => {
            let tracer = provider.tracer("assay");
            (Some(tracing_opentelemetry::layer().with_tracer(tracer)), Some(provider))
        }
        None => (None, None),
    };
    let meters = endpoint.and_then(|e| build_meter_provider(service_name, e));
    if let Some(m) = &meters {
        opentelemetry::global::set_meter_provider(m.clone());
    }
    let _ = tracing_subscriber::registry().with(filter).with(fmt).with(otel).try_init();
    TelemetryGuard { provider, meters }
}

fn resource(service_name: &str) -> opentelemetry_sdk::Resource {
    opentelemetry_sdk::Resource::builder().with_service_name(service_name.to_string()).build()
}

fn build_meter_provider(service_name: &str, endpoint: &str) -> Option<opentelemetry_sdk::metrics::SdkMeterProvider> {
    use opentelemetry_otlp::WithExportConfig;
    match opentelemetry_otlp::MetricExporter::builder().with_tonic().with_endpoint(endpoint).build() {
        Ok(exporter) => Some(
            opentelemetry_sdk::metrics::SdkMeterProvider::builder()
                .with_periodic_exporter(exporter)
                .with_resource(resource(service_name))
                .build(),
        ),
        Err(e) => {
            eprintln!("otlp metric exporter could not be built, metric export disabled: {e}");
            None
        }
    }
}

fn build_provider(service_name: &str, endpoint: &str) -> Option<opentelemetry_sdk::trace::SdkTracerProvider> {
    use opentelemetry_otlp::WithExportConfig;
    let exporter = opentelemetry_otlp::SpanExporter::builder().with_tonic().with_endpoint(endpoint).build();
    match exporter {
        Ok(exporter) => Some(
            opentelemetry_sdk::trace::SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(resource(service_name))
                .build(),
        ),
        Err(e) => {
            eprintln!("otlp exporter could not be built, tracing export disabled: {e}");
            None
        }
    }
}

struct MetadataExtractor<'a>(&'a http::HeaderMap);

impl Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

struct MetadataInjector<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (
            tonic::metadata::MetadataKey::from_bytes(key.as_bytes()),
            tonic::metadata::MetadataValue::try_from(value.as_str()),
        ) {
            self.0.insert(k, v);
        }
    }
}

/// Make `span` a child of the W3C trace context carried by incoming HTTP headers.
pub fn set_parent_from_headers(span: &tracing::Span, headers: &http::HeaderMap) {
    let cx = TraceContextPropagator::new().extract(&MetadataExtractor(headers));
    let _ = span.set_parent(cx);
}

/// The current span's W3C trace context as HTTP headers (`traceparent`, `tracestate`), for calls
/// to model servers; empty when no trace is being recorded.
pub fn current_trace_headers() -> Vec<(String, String)> {
    struct Headers(Vec<(String, String)>);
    impl Injector for Headers {
        fn set(&mut self, key: &str, value: String) {
            self.0.push((key.to_string(), value));
        }
    }
    let mut h = Headers(Vec::new());
    TraceContextPropagator::new().inject_context(&tracing::Span::current().context(), &mut h);
    h.0
}

/// Write the current span's W3C trace context (`traceparent`, `tracestate`) into outgoing metadata.
pub fn inject_current(metadata: &mut tonic::metadata::MetadataMap) {
    let cx = tracing::Span::current().context();
    TraceContextPropagator::new().inject_context(&cx, &mut MetadataInjector(metadata));
}
