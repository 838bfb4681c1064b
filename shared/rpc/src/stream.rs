//! Server-streaming calls, both ends. A stage's streaming RPC wraps its unary request under a
//! `request` field, sends one message per progress event as the work reports it, then one final
//! message with the result (or ends with the status of the work's error). [`serve_stream`] is the
//! server's half (the work runs in its own task and stops when the client goes away);
//! [`consume_stream`] is the client's (progress to the caller's sink in order, then the result).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use assay_domain::{EventSink, StageError};
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Response, Status};

use crate::{CallContext, from_status, to_status};

/// The body of a server-streaming response: messages, then the end or a status.
pub type EventStream<M> = Pin<Box<dyn Stream<Item = Result<M, Status>> + Send>>;

/// The sink a streaming call's work reports its events to; `&*emit` is the stage's
/// [`EventSink`].
pub type Emit<E> = Arc<dyn Fn(E) + Send + Sync>;

/// The wrapped request of a streaming call, which must be present (INVALID_ARGUMENT `request`).
pub fn required_request<T>(request: Option<T>) -> Result<T, Status> {
    request.ok_or_else(|| to_status(StageError::invalid("request", "is required")))
}

/// Field paths of an error about a streaming call's request, as the caller sent them: under
/// `request` (`draft` -> `request.draft`).
pub fn in_stream(e: StageError) -> StageError {
    e.map_fields(|f| format!("request.{f}"))
}

/// Field paths of a streaming call's error, back to the unary request's (`request.draft` ->
/// `draft`); the inverse of [`in_stream`].
pub fn from_stream(e: StageError) -> StageError {
    e.map_fields(|f| match f.strip_prefix("request.") {
        Some(rest) => rest.to_string(),
        None => f,
    })
}

/// Serve a streaming call: `work` runs in a task of its own with `ctx` current (its deadline
/// enforced), each event it reports goes out as `event(e)` in the order reported, then its result
/// as `result(out)`, or its error as a status with the field paths under `request`. When the client
/// goes away (the returned stream is dropped) the work is dropped with every call it has in flight.
pub fn serve_stream<E, O, M, W, Fut>(
    ctx: CallContext,
    work: W,
    event: impl Fn(E) -> M + Send + Sync + 'static,
    result: impl FnOnce(O) -> M + Send + 'static,
) -> EventStream<M>
where
    E: 'static,
    O: 'static,
    M: Send + 'static,
    W: FnOnce(Emit<E>) -> Fut,
    Fut: Future<Output = Result<O, StageError>> + Send + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel::<Result<M, Status>>();
    let events = tx.clone();
    let emit: Emit<E> = Arc::new(move |e| {
        // The client is gone when this fails: the task below is about to drop the work.
        let _ = events.send(Ok(event(e)));
    });
    let work = crate::context::run_counted(ctx, work(emit));
    tokio::spawn(tracing::Instrument::in_current_span(async move {
        tokio::select! {
            (out, spent, need) = work => {
                let status = |e| crate::spent::with_need(crate::spent::with_spent(to_status(in_stream(e)), &spent), need);
                let _ = tx.send(out.map(result).map_err(status));
            }
            () = tx.closed() => {}
        }
    }));
    Box::pin(UnboundedReceiverStream::new(rx))
}

/// What one message of a streaming reply is to its reader.
#[derive(Debug)]
pub enum Streamed<E, O> {
    /// A progress event, for the caller's sink.
    Event(E),
    /// The result: the call is done.
    Done(O),
    /// Nothing the caller is told about (a message of a kind it does not relay).
    Skip,
}

/// Read a streaming call: `read` turns each message into an event, the result or nothing; events
/// go to `events` in the order they arrive, and the result is returned once it does. A status (on
/// the call or mid-stream) comes back as a stage error with the unary request's field paths
/// ([`from_stream`]); an error of `read` as it is; a stream that ends without a result is
/// UNAVAILABLE naming `what` ("the debate stream").
pub async fn consume_stream<M, E, O, S>(
    call: impl Future<Output = Result<Response<S>, Status>>,
    events: EventSink<'_, E>,
    mut read: impl FnMut(M) -> Result<Streamed<E, O>, StageError>,
    what: &str,
) -> Result<O, StageError>
where
    S: Stream<Item = Result<M, Status>> + Unpin,
{
    let mut stream = call.await.map_err(|s| from_stream(from_status(s)))?.into_inner();
    while let Some(reply) = stream.next().await {
        match read(reply.map_err(|s| from_stream(from_status(s)))?)? {
            Streamed::Event(e) => events(e),
            Streamed::Done(out) => return Ok(out),
            Streamed::Skip => {}
        }
    }
    Err(StageError::Unavailable(format!("{what} ended without a result")))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use assay_domain::FieldViolation;
    use tokio::sync::oneshot;
    use tonic::Code;

    use super::*;

    /// A message of the test streams: progress `n` or the final value.
    #[derive(Debug, Clone, PartialEq)]
    enum Msg {
        Progress(u32),
        Final(String),
    }

    /// Every item of a stream, to its end.
    async fn drain(stream: EventStream<Msg>) -> Vec<Result<Msg, Status>> {
        tokio::time::timeout(Duration::from_secs(5), stream.collect()).await.expect("the stream ends")
    }

    #[tokio::test]
    async fn serve_forwards_progress_in_order_then_the_result() {
        let stream = serve_stream(
            CallContext::default(),
            |emit: Emit<u32>| async move {
                for n in 0..50 {
                    emit(n);
                    if n % 7 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
                Ok("done".to_string())
            },
            Msg::Progress,
            Msg::Final,
        );
        let items: Vec<Msg> = drain(stream).await.into_iter().map(|r| r.expect("no status")).collect();
        let mut want: Vec<Msg> = (0..50).map(Msg::Progress).collect();
        want.push(Msg::Final("done".into()));
        assert_eq!(items, want);
    }

    #[tokio::test]
    async fn serve_ends_with_the_error_status_fields_under_request() {
        let stream = serve_stream(
            CallContext::default(),
            |emit: Emit<u32>| async move {
                emit(1);
                Err::<String, _>(StageError::InvalidArgument(vec![FieldViolation::new("draft", "must not be empty")]))
            },
            Msg::Progress,
            Msg::Final,
        );
        let items = drain(stream).await;
        assert_eq!(items.len(), 2, "{items:?}");
        assert_eq!(items[0].as_ref().ok(), Some(&Msg::Progress(1)));
        let status = items[1].as_ref().expect_err("the error ends the stream");
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(
            from_status(status.clone()),
            StageError::InvalidArgument(vec![FieldViolation::new("request.draft", "must not be empty")])
        );

        let failed = async { Err::<String, _>(StageError::Unavailable("model down".into())) };
        assert_eq!(only_status(CallContext::default(), failed).await.code(), Code::Unavailable);
    }

    /// The one item of a stream served over `work`, which must be a status.
    async fn only_status(
        ctx: CallContext,
        work: impl Future<Output = Result<String, StageError>> + Send + 'static,
    ) -> Status {
        let items = drain(serve_stream(ctx, |_: Emit<u32>| work, Msg::Progress, Msg::Final)).await;
        assert_eq!(items.len(), 1, "{items:?}");
        items.into_iter().next().and_then(Result::err).expect("a status")
    }

    #[tokio::test]
    async fn serve_enforces_the_callers_deadline() {
        let ctx = CallContext {
            deadline: Some(std::time::Instant::now() + Duration::from_millis(50)),
            ..CallContext::default()
        };
        let endless = std::future::pending::<Result<String, StageError>>();
        assert_eq!(only_status(ctx, endless).await.code(), Code::DeadlineExceeded);
    }

    #[tokio::test]
    async fn serve_drops_the_work_when_the_client_goes_away() {
        let (held, dropped) = oneshot::channel::<()>();
        let (started_tx, started) = oneshot::channel::<()>();
        let mut stream = serve_stream(
            CallContext::default(),
            move |emit: Emit<u32>| async move {
                // Dropped with the work: `dropped` then sees its sender gone.
                let _held = held;
                emit(1);
                let _ = started_tx.send(());
                std::future::pending::<()>().await;
                Ok(String::new())
            },
            Msg::Progress,
            Msg::Final,
        );
        assert_eq!(stream.next().await.map(|r| r.ok()), Some(Some(Msg::Progress(1))));
        started.await.expect("the work started");
        drop(stream);
        // The work's future is dropped (and with it what it held) once the client is gone.
        tokio::time::timeout(Duration::from_secs(5), dropped)
            .await
            .expect("the work was dropped")
            .expect_err("nothing is ever sent: the sender is dropped");
    }

    /// A reply as a test stream sees it: `Ok(None)` is a message the reader skips.
    fn replies(items: Vec<Result<Option<Msg>, Status>>) -> impl Future<Output = Result<Response<ReplyStream>, Status>> {
        std::future::ready(Ok(Response::new(futures::stream::iter(items))))
    }

    type ReplyStream = futures::stream::Iter<std::vec::IntoIter<Result<Option<Msg>, Status>>>;

    fn read(m: Option<Msg>) -> Result<Streamed<u32, String>, StageError> {
        Ok(match m {
            Some(Msg::Progress(n)) => Streamed::Event(n),
            Some(Msg::Final(s)) => Streamed::Done(s),
            None => Streamed::Skip,
        })
    }

    #[tokio::test]
    async fn consume_hands_progress_in_order_and_returns_the_result() {
        let seen = std::sync::Mutex::new(Vec::new());
        let sink = |n: u32| seen.lock().unwrap().push(n);
        let mut items: Vec<Result<Option<Msg>, Status>> = (0..20).map(|n| Ok(Some(Msg::Progress(n)))).collect();
        items.insert(5, Ok(None));
        items.push(Ok(Some(Msg::Final("done".into()))));
        // Nothing after the result is read.
        items.push(Ok(Some(Msg::Progress(99))));
        let out = consume_stream(replies(items), &sink, read, "the test stream").await;
        assert_eq!(out, Ok("done".to_string()));
        assert_eq!(*seen.lock().unwrap(), (0..20).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn consume_without_a_result_is_unavailable_naming_the_stream() {
        let seen = std::sync::Mutex::new(Vec::new());
        let sink = |n: u32| seen.lock().unwrap().push(n);
        let items = vec![Ok(Some(Msg::Progress(1))), Ok(None)];
        let out = consume_stream(replies(items), &sink, read, "the test stream").await;
        assert_eq!(out, Err(StageError::Unavailable("the test stream ended without a result".into())));
        assert_eq!(*seen.lock().unwrap(), vec![1]);
    }

    #[tokio::test]
    async fn consume_maps_statuses_back_to_the_unary_fields() {
        let bad =
            || to_status(StageError::InvalidArgument(vec![FieldViolation::new("request.draft", "must not be empty")]));
        let want = Err(StageError::InvalidArgument(vec![FieldViolation::new("draft", "must not be empty")]));
        // Refused before the stream starts.
        let refused = std::future::ready(Err::<Response<ReplyStream>, _>(bad()));
        assert_eq!(consume_stream(refused, &assay_domain::no_events, read, "s").await, want);
        // Failed mid-stream, after some progress.
        let seen = std::sync::Mutex::new(Vec::new());
        let sink = |n: u32| seen.lock().unwrap().push(n);
        let items = vec![Ok(Some(Msg::Progress(3))), Err(bad())];
        assert_eq!(consume_stream(replies(items), &sink, read, "s").await, want);
        assert_eq!(*seen.lock().unwrap(), vec![3]);
    }

    #[tokio::test]
    async fn consume_returns_a_reading_error_as_it_is() {
        let items = vec![Ok(Some(Msg::Progress(1))), Ok(Some(Msg::Final("x".into())))];
        let broken = |_: Option<Msg>| Err::<Streamed<u32, String>, _>(StageError::Internal("bad message".into()));
        let out = consume_stream(replies(items), &assay_domain::no_events, broken, "s").await;
        assert_eq!(out, Err(StageError::Internal("bad message".into())));
    }

    #[tokio::test]
    async fn both_halves_agree_over_a_channel() {
        let served = serve_stream(
            CallContext::default(),
            |emit: Emit<u32>| async move {
                emit(1);
                emit(2);
                Ok("done".to_string())
            },
            |n| Some(Msg::Progress(n)),
            |s| Some(Msg::Final(s)),
        );
        let seen = std::sync::Mutex::new(Vec::new());
        let sink = |n: u32| seen.lock().unwrap().push(n);
        let call = std::future::ready(Ok(Response::new(served)));
        assert_eq!(consume_stream(call, &sink, read, "s").await, Ok("done".to_string()));
        assert_eq!(*seen.lock().unwrap(), vec![1, 2]);
    }
}
