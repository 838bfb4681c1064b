//! The context of one incoming call (deadline, W3C trace context and budget), carried in a
//! task-local so every outgoing hop made while serving it forwards them. tonic does not forward
//! deadlines itself; budgets travel the same way ([`assay_budget`]).

use std::future::Future;
use std::time::{Duration, Instant};

use crate::spent::{with_need, with_spent};
use crate::status::to_status;

tokio::task_local! {
    static CURRENT: CallContext;
}

/// Deadline and trace headers of the call being served.
#[derive(Debug, Clone, Default)]
pub struct CallContext {
    pub deadline: Option<Instant>,
    /// `traceparent` / `tracestate` as received.
    pub trace_headers: Vec<(String, String)>,
    /// The budget the caller left for this call (`assay-budget-tokens` / `assay-budget-usd`).
    pub budget: assay_budget::Limits,
}

impl CallContext {
    /// Read the caller's `grpc-timeout` and trace headers.
    pub fn from_metadata(metadata: &tonic::metadata::MetadataMap) -> CallContext {
        let deadline = metadata
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_grpc_timeout)
            .map(|d| Instant::now() + d);
        let trace_headers = ["traceparent", "tracestate"]
            .iter()
            .filter_map(|k| metadata.get(*k).and_then(|v| v.to_str().ok()).map(|v| ((*k).to_string(), v.to_string())))
            .collect();
        let header = |k: &str| metadata.get(k).and_then(|v| v.to_str().ok());
        let budget =
            assay_budget::Limits::from_headers(header(assay_budget::TOKENS_HEADER), header(assay_budget::USD_HEADER));
        CallContext { deadline, trace_headers, budget }
    }

    pub fn from_request<T>(request: &tonic::Request<T>) -> CallContext {
        Self::from_metadata(request.metadata())
    }

    /// The context of the call being served, if any.
    pub fn current() -> CallContext {
        CURRENT.try_with(Clone::clone).unwrap_or_default()
    }

    /// Run `fut` with this context as the current one.
    pub async fn scope<F: Future>(self, fut: F) -> F::Output {
        CURRENT.scope(self, fut).await
    }

    /// Time left before the deadline.
    pub fn remaining(&self) -> Option<Duration> {
        self.deadline.map(|d| d.saturating_duration_since(Instant::now()))
    }
}

/// Parse a `grpc-timeout` header value (`<digits><unit>`, unit H M S m u n).
pub fn parse_grpc_timeout(v: &str) -> Option<Duration> {
    if v.len() < 2 || v.len() > 9 {
        return None;
    }
    let (digits, unit) = v.split_at(v.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Build an outgoing request carrying the current call's remaining deadline and trace context.
pub fn outgoing<T>(message: T) -> tonic::Request<T> {
    let ctx = CallContext::current();
    let mut request = tonic::Request::new(message);
    if let Some(left) = ctx.remaining() {
        request.set_timeout(left.max(Duration::from_millis(1)));
    }
    assay_telemetry::inject_current(request.metadata_mut());
    // What is left of the work's budget goes with the call, as the deadline does.
    if let Some(budget) = assay_budget::current() {
        for (k, v) in budget.remaining().headers() {
            if let Ok(v) = tonic::metadata::MetadataValue::try_from(v.as_str()) {
                request.metadata_mut().insert(k, v);
            }
        }
    }
    for (k, v) in &ctx.trace_headers {
        if request.metadata().get(k.as_str()).is_none()
            && let (Ok(key), Ok(val)) = (
                tonic::metadata::MetadataKey::from_bytes(k.as_bytes()),
                tonic::metadata::MetadataValue::try_from(v.as_str()),
            )
        {
            request.metadata_mut().insert(key, val);
        }
    }
    request
}

/// Run a handler body with `ctx` current, enforcing the caller's deadline ourselves (tonic reports
/// an expired grpc-timeout as CANCELLED; callers deserve DEADLINE_EXCEEDED). An error status
/// carries what the call's model calls had spent ([`with_spent`]).
pub async fn run_with<T, F>(ctx: CallContext, fut: F) -> Result<T, tonic::Status>
where
    F: Future<Output = Result<T, assay_domain::StageError>>,
{
    let (out, spent, need) = run_counted(ctx, fut).await;
    out.map_err(|e| with_need(with_spent(to_status(e), &spent), need))
}

/// [`run_with`]'s work: the handler's result, everything its model calls spent (a budget is
/// always current while serving, without limits when the caller sent none, so it counts) and
/// what a model call refused for lack of budget needed.
pub(crate) async fn run_counted<T, F>(
    ctx: CallContext,
    fut: F,
) -> (Result<T, assay_domain::StageError>, assay_domain::Usage, Option<assay_budget::Cost>)
where
    F: Future<Output = Result<T, assay_domain::StageError>>,
{
    // Answer a little before the caller's own timer fires, so the caller sees our status rather
    // than its transport's generic cancellation.
    let deadline = ctx.deadline.map(|d| {
        let left = d.saturating_duration_since(std::time::Instant::now());
        d - (left / 10).min(Duration::from_millis(50))
    });
    let limits = ctx.budget;
    let work = ctx.scope(async move {
        match deadline {
            Some(d) => tokio::time::timeout_at(tokio::time::Instant::from_std(d), fut).await.unwrap_or_else(|_| {
                Err(assay_domain::StageError::DeadlineExceeded("the call's deadline passed".into()))
            }),
            None => fut.await,
        }
    });
    // Every model call made while serving is charged to (and, with limits, held to) this budget.
    let budget = assay_budget::Budget::new(limits);
    let out = assay_budget::scope(budget.clone(), work).await;
    (out, budget.spent(), budget.refused_need())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeout_units() {
        assert_eq!(parse_grpc_timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse_grpc_timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_grpc_timeout("7u"), Some(Duration::from_micros(7)));
        assert_eq!(parse_grpc_timeout("S"), None);
        assert_eq!(parse_grpc_timeout("12x"), None);
        assert_eq!(parse_grpc_timeout("123456789S"), None);
    }

    #[tokio::test]
    async fn outgoing_forwards_deadline_and_trace() {
        let mut md = tonic::metadata::MetadataMap::new();
        md.insert("grpc-timeout", "3S".parse().unwrap());
        md.insert("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".parse().unwrap());
        let ctx = CallContext::from_metadata(&md);
        let req = ctx.scope(async { outgoing(()) }).await;
        let t = req.metadata().get("grpc-timeout").unwrap().to_str().unwrap().to_string();
        let d = parse_grpc_timeout(&t).unwrap();
        assert!(d <= Duration::from_secs(3) && d > Duration::from_secs(2), "{t}");
        assert_eq!(
            req.metadata().get("traceparent").unwrap().to_str().unwrap(),
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        );
    }

    #[test]
    fn no_context_means_no_deadline() {
        let req = outgoing(());
        assert!(req.metadata().get("grpc-timeout").is_none());
    }
}
