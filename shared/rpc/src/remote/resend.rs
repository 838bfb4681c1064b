//! Resend a call that never left the client: when a server closes a connection (GOAWAY at
//! `max_connection_age`, or while it drains before a pod exits), a call handed to that connection
//! just before the client saw the GOAWAY fails with hyper's "canceled: connection closed" without
//! having been sent. Such a call is sent again (the channel connects anew), at most
//! [`MAX_SENDS`] times in all. A call that reached the server is never sent twice.
//!
//! Every Assay request is one message (unary and server-streaming RPCs), so its body is buffered
//! to be sent again.

use std::task::{Context, Poll};

use bytes::Bytes;
use futures::future::BoxFuture;
use http_body_util::BodyExt;
use tonic::body::Body;
use tower::{Service, ServiceExt};

/// Sends of one call at most (the first and two resends).
pub const MAX_SENDS: usize = 3;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A channel that resends calls that never left the client (see the module docs).
#[derive(Clone, Debug)]
pub struct ResendUnsent<S> {
    inner: S,
}

impl<S> ResendUnsent<S> {
    pub fn new(inner: S) -> Self {
        Self { inner }
    }
}

/// Whether `e` says the request was dropped before it was written to the connection.
pub fn never_sent(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(h) = err.downcast_ref::<hyper::Error>() {
            return h.is_canceled();
        }
        cur = err.source();
    }
    false
}

impl<S, R> Service<http::Request<Body>> for ResendUnsent<S>
where
    S: Service<http::Request<Body>, Response = http::Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: std::error::Error + Send + Sync + 'static,
    R: Send + 'static,
{
    type Response = http::Response<R>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // The service polled ready goes with this call; the clone stays for the next one.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let bytes: Bytes = body.collect().await.map_err(|s| Box::new(s) as BoxError)?.to_bytes();
            let rebuild = || {
                let mut r = http::Request::new(Body::new(http_body_util::Full::new(bytes.clone())));
                *r.method_mut() = parts.method.clone();
                *r.uri_mut() = parts.uri.clone();
                *r.version_mut() = parts.version;
                *r.headers_mut() = parts.headers.clone();
                *r.extensions_mut() = parts.extensions.clone();
                r
            };
            let mut sends = 1;
            let mut result = inner.call(rebuild()).await;
            while let Err(e) = &result {
                if sends >= MAX_SENDS || !never_sent(e) {
                    break;
                }
                tracing::debug!(error = %e, sends, "call never sent (connection closing), sending it again");
                sends += 1;
                result = match inner.ready().await {
                    Ok(ready) => ready.call(rebuild()).await,
                    Err(e) => Err(e),
                };
            }
            result.map_err(Into::into)
        })
    }
}
