//! Per-RPC server metrics: `rpc.server.call.duration` (seconds, the OpenTelemetry RPC semantic
//! conventions) by `rpc.service`, `rpc.method` and `rpc.grpc.status_code`, measured from the
//! request to the end of the response stream, so a server-streaming call counts until its last
//! message. A call whose client went away before the end counts as CANCELLED (1).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use futures::future::BoxFuture;
use http_body::{Body as HttpBody, Frame, SizeHint};
use opentelemetry::KeyValue;
use opentelemetry::metrics::Histogram;
use tonic::body::Body;

/// Records `rpc.server.call.duration` for every call it wraps.
#[derive(Clone)]
pub struct MetricsLayer {
    duration: Histogram<f64>,
}

impl MetricsLayer {
    /// The layer over the global meter ([`assay_telemetry::meter`]).
    pub fn new() -> MetricsLayer {
        let duration = assay_telemetry::meter()
            .f64_histogram("rpc.server.call.duration")
            .with_unit("s")
            .with_description("Duration of gRPC calls served, to the end of the response stream")
            .with_boundaries(assay_telemetry::DURATION_BUCKETS.to_vec())
            .build();
        MetricsLayer { duration }
    }
}

impl Default for MetricsLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MetricsLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MetricsLayer")
    }
}

impl<S> tower::Layer<S> for MetricsLayer {
    type Service = Metered<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Metered { inner, duration: self.duration.clone() }
    }
}

/// The service [`MetricsLayer`] produces.
#[derive(Clone)]
pub struct Metered<S> {
    inner: S,
    duration: Histogram<f64>,
}

impl<S> tower::Service<http::Request<Body>> for Metered<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let path = req.uri().path().trim_start_matches('/');
        let (service, method) = path.split_once('/').unwrap_or((path, ""));
        let call = Call {
            duration: self.duration.clone(),
            started: Instant::now(),
            service: service.to_string(),
            method: method.to_string(),
            recorded: false,
        };
        let fut = self.inner.call(req);
        Box::pin(async move {
            let response = fut.await?;
            // A trailers-only response (most errors) carries its status in the headers.
            if let Some(code) = grpc_status(response.headers()) {
                let mut call = call;
                call.record(code);
                return Ok(response);
            }
            Ok(response.map(|body| Body::new(MeteredBody { inner: body, call })))
        })
    }
}

fn grpc_status(headers: &http::HeaderMap) -> Option<i64> {
    headers.get("grpc-status")?.to_str().ok()?.parse().ok()
}

struct Call {
    duration: Histogram<f64>,
    started: Instant,
    service: String,
    method: String,
    recorded: bool,
}

impl Call {
    fn record(&mut self, code: i64) {
        if std::mem::replace(&mut self.recorded, true) {
            return;
        }
        self.duration.record(
            self.started.elapsed().as_secs_f64(),
            &[
                KeyValue::new("rpc.system", "grpc"),
                KeyValue::new("rpc.service", std::mem::take(&mut self.service)),
                KeyValue::new("rpc.method", std::mem::take(&mut self.method)),
                KeyValue::new("rpc.grpc.status_code", code),
            ],
        );
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        // The stream was dropped before its trailers: the client cancelled or went away.
        self.record(tonic::Code::Cancelled as i64);
    }
}

struct MeteredBody {
    inner: Body,
    call: Call,
}

impl HttpBody for MeteredBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(code) = frame.trailers_ref().and_then(grpc_status) {
                    self.call.record(code);
                }
            }
            Poll::Ready(Some(Err(status))) => {
                let code = status.code() as i64;
                self.call.record(code);
            }
            // Ended without trailers: nothing says it failed.
            Poll::Ready(None) => self.call.record(tonic::Code::Ok as i64),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
