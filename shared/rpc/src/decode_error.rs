//! A request message that does not decode (a string field holding invalid UTF-8, broken wire data)
//! is the caller's bad input: INVALID_ARGUMENT with a BadRequest violation naming the field, where
//! tonic answers INTERNAL ("failed to decode Protobuf message: ...").
//!
//! tonic decodes the request before any handler runs and answers a failure with a trailers-only
//! response carrying the [`Status`] in its extensions; [`DecodeErrorLayer`] rewrites those. Only a
//! failure inside the called method's own request message (`<Method>Request`, the contracts' naming
//! rule) is rewritten, so an INTERNAL a handler relays from an upstream reply that did not decode
//! stays INTERNAL.

use std::task::{Context, Poll};

use futures::future::BoxFuture;
use tonic::body::Body;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// What prost's `DecodeError` says first.
const DECODE_PREFIX: &str = "failed to decode Protobuf message: ";
/// prost's description of a string field that is not UTF-8.
const INVALID_STRING: &str = "invalid string value: data is not UTF-8 encoded";

/// Turns request decode failures into INVALID_ARGUMENT naming the field.
#[derive(Clone, Copy, Debug, Default)]
pub struct DecodeErrorLayer;

impl<S> tower::Layer<S> for DecodeErrorLayer {
    type Service = DecodeErrors<S>;
    fn layer(&self, inner: S) -> Self::Service {
        DecodeErrors { inner }
    }
}

/// The service [`DecodeErrorLayer`] produces.
#[derive(Clone, Debug)]
pub struct DecodeErrors<S> {
    inner: S,
}

impl<S> tower::Service<http::Request<Body>> for DecodeErrors<S>
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
        let method = req.uri().path().rsplit('/').next().unwrap_or_default().to_string();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let response = fut.await?;
            match response.extensions().get::<Status>().and_then(|s| request_decode_failure(s, &method)) {
                Some(status) => Ok(status.into_http()),
                None => Ok(response),
            }
        })
    }
}

/// The INVALID_ARGUMENT for `status` when it is tonic's failure to decode the request message of
/// `method` (`None` for any other status). The field is the path of prost's error stack
/// (`pipeline.records.target`: repeated fields carry no index), or `request` when the message
/// itself is malformed.
pub fn request_decode_failure(status: &Status, method: &str) -> Option<Status> {
    if status.code() != Code::Internal {
        return None;
    }
    let rest = status.message().strip_prefix(DECODE_PREFIX)?;
    // prost lists (message, field) from the innermost message out: "Inner.f: Outer.g: why".
    let mut stack = Vec::new();
    let mut why = rest;
    while let Some((head, tail)) = why.split_once(": ") {
        let Some((message, field)) = head.split_once('.').filter(|(m, f)| is_ident(m) && is_ident(f)) else {
            break;
        };
        stack.push((message, field));
        why = tail;
    }
    let request_message = format!("{method}Request");
    let (field, description) = match stack.last() {
        // A failure inside some other message (an upstream reply a handler relays): not ours.
        Some((outermost, _)) if !method.is_empty() && !outermost.ends_with(&request_message) => return None,
        Some(_) => {
            let path: Vec<&str> = stack.iter().rev().map(|(_, f)| *f).collect();
            let description = if why == INVALID_STRING {
                "is not valid UTF-8 (string fields must be UTF-8 encoded)".to_string()
            } else {
                format!("cannot be decoded: {why}")
            };
            (path.join("."), description)
        }
        None => ("request".to_string(), format!("is not a valid {request_message} message: {why}")),
    };
    let mut details = ErrorDetails::new();
    details.add_bad_request_violation(field.clone(), description.clone());
    Some(Status::with_error_details(Code::InvalidArgument, format!("{field}: {description}"), details))
}

fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn violation(s: &Status) -> (String, String) {
        let bad = s.get_details_bad_request().expect("bad request details");
        (bad.field_violations[0].field.clone(), bad.field_violations[0].description.clone())
    }

    #[test]
    fn invalid_utf8_names_the_field_path() {
        let decode = Status::internal(
            "failed to decode Protobuf message: EvalRecord.target: ChecklistEvalPipeline.records: \
             RunPipelineRequest.pipeline: invalid string value: data is not UTF-8 encoded",
        );
        let s = request_decode_failure(&decode, "RunPipeline").expect("rewritten");
        assert_eq!(s.code(), Code::InvalidArgument);
        let (field, description) = violation(&s);
        assert_eq!(field, "pipeline.records.target");
        assert!(description.contains("UTF-8"), "{description}");
        assert!(s.message().starts_with("pipeline.records.target: "), "{}", s.message());
    }

    #[test]
    fn other_wire_errors_keep_prosts_reason() {
        let decode = Status::internal(
            "failed to decode Protobuf message: GetRunRequest.run_id: invalid wire type: Varint (expected LengthDelimited)",
        );
        let s = request_decode_failure(&decode, "GetRun").expect("rewritten");
        assert_eq!(
            violation(&s),
            ("run_id".into(), "cannot be decoded: invalid wire type: Varint (expected LengthDelimited)".into())
        );
        let garbage = Status::internal("failed to decode Protobuf message: invalid varint");
        let s = request_decode_failure(&garbage, "GetRun").expect("rewritten");
        assert_eq!(violation(&s).0, "request");
        assert!(violation(&s).1.contains("GetRunRequest"));
    }

    #[test]
    fn anything_else_is_left_alone() {
        // A relayed failure to decode an upstream reply is an internal error, not bad input.
        let relayed = Status::internal(
            "failed to decode Protobuf message: Score.pass_rate: ScoreResponse.scores: invalid wire type: Varint (expected SixtyFourBit)",
        );
        assert!(request_decode_failure(&relayed, "Evaluate").is_none());
        assert!(request_decode_failure(&Status::internal("boom"), "Evaluate").is_none());
        assert!(request_decode_failure(&Status::invalid_argument(DECODE_PREFIX), "Evaluate").is_none());
    }
}
