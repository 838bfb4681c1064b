//! Optional bearer-token authentication for every RPC except the health service.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use tonic::body::Body;

const HEALTH_PREFIX: &str = "/grpc.health.v1.Health/";

/// Requires `authorization: Bearer <token>` when a token is configured.
#[derive(Clone, Default)]
pub struct AuthLayer {
    token: Option<Arc<str>>,
}

impl AuthLayer {
    /// `None` or an empty token disables auth.
    pub fn new(token: Option<String>) -> Self {
        Self { token: token.filter(|t| !t.is_empty()).map(Arc::from) }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = Auth<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Auth { inner, token: self.token.clone() }
    }
}

/// The service [`AuthLayer`] produces.
#[derive(Clone)]
pub struct Auth<S> {
    inner: S,
    token: Option<Arc<str>>,
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether an `authorization` header value is `Bearer <token>` (scheme case-insensitive, as RFC
/// 7235 says; the token compared in constant time).
pub fn bearer_matches(authorization: Option<&str>, token: &str) -> bool {
    authorization
        .and_then(|v| v.split_once(' ').filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer")))
        .map(|(_, t)| t)
        .is_some_and(|t| constant_time_eq(t.trim().as_bytes(), token.as_bytes()))
}

impl<S> tower::Service<http::Request<Body>> for Auth<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        if let Some(token) = &self.token
            && !req.uri().path().starts_with(HEALTH_PREFIX)
        {
            let ok =
                bearer_matches(req.headers().get(http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()), token);
            if !ok {
                let status = tonic::Status::unauthenticated("missing or wrong bearer token");
                return Box::pin(async move { Ok(status.into_http()) });
            }
        }
        let fut = self.inner.call(req);
        Box::pin(fut)
    }
}

/// Client-side interceptor adding the bearer token (for the gateway's stage clients and tests).
#[derive(Clone, Default)]
pub struct BearerInterceptor {
    header: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
}

impl BearerInterceptor {
    pub fn new(token: Option<&str>) -> Self {
        Self { header: token.filter(|t| !t.is_empty()).and_then(|t| format!("Bearer {t}").parse().ok()) }
    }
}

impl tonic::service::Interceptor for BearerInterceptor {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(h) = &self.header {
            request.metadata_mut().insert("authorization", h.clone());
        }
        Ok(request)
    }
}
