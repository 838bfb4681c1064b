//! How a verb follows the run it started: the one follower ([`follow_run`]: the run's event stream,
//! reattached from the last event seen when it breaks) and the one reading of a finished run
//! ([`finished`]: its result, or why there is none), shared by every verb and by `assay runs`.

use std::pin::Pin;

use assay_proto::gateway::v1 as gw;
use assay_proto::pipelines::PipelineContract;
use futures::{Stream, StreamExt};

use super::error::{CliError, status_text};
use super::render::state_name;
use super::session::Client;

/// The run events of a `RunPipeline` or `WatchRun` stream.
pub type Events = Pin<Box<dyn Stream<Item = Result<gw::RunEvent, tonic::Status>> + Send>>;

/// The run events of a stream of `M`s.
pub fn events_of<M: Send + 'static>(stream: tonic::Streaming<M>, event: fn(M) -> Option<gw::RunEvent>) -> Events {
    Box::pin(stream.filter_map(move |m| futures::future::ready(m.map(event).transpose())))
}

/// Reattachments in a row that bring no new event before the follower gives up.
pub const MAX_QUIET_REATTACH: u32 = 3;

/// Start a run: the events of its `RunPipeline` stream. A request the gateway refuses as invalid
/// is bad input ([`CliError`]'s conversion of a status).
pub async fn start_run(client: &mut Client, request: gw::RunPipelineRequest) -> Result<Events, CliError> {
    let stream = client.run_pipeline(request).await?;
    super::timings::mark("admitted");
    Ok(events_of(stream.into_inner(), |m: gw::RunPipelineResponse| m.event))
}

/// Start a run and follow it until the verb is done ([`start_run`], [`follow_run`]).
pub async fn run_and_follow<F: RunFollower>(
    client: &mut Client,
    request: gw::RunPipelineRequest,
    follower: &mut F,
) -> Result<F::Ending, CliError> {
    let events = start_run(client, request).await?;
    follow_run(client, events, follower).await
}

/// What one event means to the verb following the run.
pub enum Step<T> {
    /// Keep following.
    Continue,
    /// Stop following: the verb ends so.
    Done(T),
    /// Stop following: the run waits for a human ([`RunFollower::awaiting_human`]).
    AwaitingHuman,
}

/// A verb that follows the events of the run it started ([`follow_run`]).
pub trait RunFollower {
    /// How the verb ends when it does not fail.
    type Ending;
    /// One event of the run.
    fn on_event(&mut self, event: gw::RunEvent) -> Step<Result<Self::Ending, CliError>>;

    /// The event stream ended before the verb was done; `run` is the run as the gateway stores it.
    /// `None` follows the run again from the last event seen.
    fn on_stream_end(&mut self, run: gw::Run) -> Option<Result<Self::Ending, CliError>>;

    /// After [`Step::AwaitingHuman`]: how the verb ends, given the stored run when the gateway gave
    /// it.
    fn awaiting_human(&mut self, run: Option<&gw::Run>) -> Result<Self::Ending, CliError> {
        let id = run.map_or("", |r| r.run_id.as_str());
        Err(CliError::Failed(format!("run {id} waits for a human")))
    }
}

/// Whether a run in this state is over (succeeded, partial, failed or cancelled).
pub fn is_final(state: i32) -> bool {
    match gw::RunState::try_from(state) {
        Ok(gw::RunState::Succeeded | gw::RunState::Partial | gw::RunState::Failed | gw::RunState::Cancelled) => true,
        Ok(
            gw::RunState::Unspecified
            | gw::RunState::Pending
            | gw::RunState::Running
            | gw::RunState::Paused
            | gw::RunState::AwaitingHuman,
        )
        | Err(_) => false,
    }
}

/// Follow a run's `events` until the verb is done. When the stream breaks (resource exhausted,
/// unavailable) or ends early, the run is followed again (`WatchRun` from the last sequence seen,
/// after a pause of a second); after [`MAX_QUIET_REATTACH`] reattachments in a row without a new
/// event, following fails.
pub async fn follow_run<F: RunFollower>(
    client: &mut Client,
    mut events: Events,
    follower: &mut F,
) -> Result<F::Ending, CliError> {
    let mut run = Followed::default();
    loop {
        match events.next().await {
            Some(Ok(ev)) => {
                super::timings::mark("first_event");
                run.seen(&ev);
                let at = ev.time;
                if matches!(ev.event, Some(gw::run_event::Event::Completed(_))) {
                    super::timings::mark("completed_received");
                }
                match follower.on_event(ev) {
                    Step::Continue => {}
                    Step::Done(outcome) => {
                        super::timings::mark("ended");
                        if let Some(t) = at {
                            super::timings::mark_at("ended_at_gateway", t.seconds as f64 + f64::from(t.nanos) / 1e9);
                        }
                        return outcome;
                    }
                    Step::AwaitingHuman => {
                        let stored = run.get(client).await.ok();
                        return follower.awaiting_human(stored.as_ref());
                    }
                }
            }
            Some(Err(s)) if gateway_went_away(&s) => {
                eprintln!("event stream interrupted ({}); reattaching", s.message());
                events = run.reattach(client).await?;
            }
            Some(Err(s)) => return Err(CliError::Failed(interrupted(&s, &run.run_id))),
            None => {
                let stored = run.get(client).await?;
                match follower.on_stream_end(stored) {
                    Some(outcome) => return outcome,
                    None => events = run.reattach(client).await?,
                }
            }
        }
    }
}

/// Seconds a follower waits for a gateway that went away to answer again.
const RESTART_WAIT_SECONDS: u32 = 120;

/// Whether a status means the gateway went away for a while (overloaded, restarting, the
/// connection cut): the run goes on in its store, and following it resumes once it answers.
fn gateway_went_away(s: &tonic::Status) -> bool {
    matches!(s.code(), tonic::Code::ResourceExhausted | tonic::Code::Unavailable)
        || std::error::Error::source(s).is_some()
}

/// Where following a run stands.
#[derive(Default)]
struct Followed {
    run_id: String,
    last_sequence: u64,
    /// Reattachments since the last event.
    quiet: u32,
}

impl Followed {
    fn seen(&mut self, ev: &gw::RunEvent) {
        if self.run_id.is_empty() {
            self.run_id.clone_from(&ev.run_id);
        }
        self.last_sequence = self.last_sequence.max(ev.sequence);
        self.quiet = 0;
    }

    /// Follow the run again from the last sequence seen (after a pause of a second).
    async fn reattach(&mut self, client: &mut Client) -> Result<Events, CliError> {
        self.quiet += 1;
        if self.quiet > MAX_QUIET_REATTACH {
            return Err(CliError::Failed(format!(
                "lost the events of run {id}; follow it with `assay runs watch {id} --after {}`",
                self.last_sequence,
                id = self.run_id
            )));
        }
        // A gateway restarting (killed, redeployed) takes a few seconds to listen again: the run
        // is in its store and goes on once it does.
        let mut waited = 0;
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            waited += 1;
            let request = gw::WatchRunRequest { run_id: self.run_id.clone(), after_sequence: self.last_sequence };
            match client.watch_run(request).await {
                Ok(stream) => return Ok(events_of(stream.into_inner(), |m: gw::WatchRunResponse| m.event)),
                Err(s) if gateway_went_away(&s) && waited < RESTART_WAIT_SECONDS => {}
                Err(s) => return Err(CliError::Failed(interrupted(&s, &self.run_id))),
            }
        }
    }

    /// The run as the gateway stores it.
    async fn get(&self, client: &mut Client) -> Result<gw::Run, CliError> {
        if self.run_id.is_empty() {
            return Err(CliError::Failed("the gateway ended the event stream before the run started".into()));
        }
        let reply = client
            .get_run(gw::GetRunRequest { run_id: self.run_id.clone() })
            .await
            .map_err(|s| CliError::Failed(status_text(&s)))?;
        reply.into_inner().run.ok_or_else(|| CliError::Failed(format!("run {}: the gateway sent no run", self.run_id)))
    }
}

/// Why a finished run has no result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoResult {
    /// The run was cancelled.
    Cancelled,
    /// The run failed, for this reason (empty when the gateway gave none).
    Failed(String),
    /// The run succeeded without a result of the kind the verb expects (`what`).
    Missing(&'static str),
    /// The run is not over (this state).
    NotFinal(i32),
}

impl NoResult {
    /// The error line of run `run_id` (`run 01J... was cancelled`).
    pub fn message(&self, run_id: &str) -> String {
        match self {
            NoResult::Cancelled => format!("run {run_id} was cancelled"),
            NoResult::Failed(why) if why.is_empty() => format!("run {run_id} failed: no reason given"),
            NoResult::Failed(why) => format!("run {run_id} failed: {why}"),
            NoResult::Missing(what) => format!("run {run_id} returned no {what}"),
            NoResult::NotFinal(state) => format!("run {run_id} completed in state {}", state_name(*state)),
        }
    }
}

/// A finished run's result (`state` and `result` as the `completed` event or the stored run give
/// them), or why there is none: cancelled, failed with a reason, failed or succeeded without a
/// result, or not over. A run that failed with a result and no reason is a result: an evaluation
/// or a debate ends failed when every record or problem failed, and their lines still tell why.
pub fn finished(state: i32, result: Option<gw::RunResult>) -> Result<gw::run_result::Result, NoResult> {
    let result = result.unwrap_or_default();
    match gw::RunState::try_from(state) {
        Ok(gw::RunState::Cancelled) => Err(NoResult::Cancelled),
        Ok(gw::RunState::Succeeded | gw::RunState::Partial | gw::RunState::Failed) if !result.error.is_empty() => {
            Err(NoResult::Failed(result.error))
        }
        Ok(gw::RunState::Failed) => result.result.ok_or(NoResult::Failed(String::new())),
        Ok(gw::RunState::Succeeded | gw::RunState::Partial) => result.result.ok_or(NoResult::Missing("result")),
        Ok(
            gw::RunState::Unspecified
            | gw::RunState::Pending
            | gw::RunState::Running
            | gw::RunState::Paused
            | gw::RunState::AwaitingHuman,
        )
        | Err(_) => Err(NoResult::NotFinal(state)),
    }
}

/// [`finished`], for a verb that expects a result of pipeline kind `C`: a result of another kind
/// is [`NoResult::Missing`] (`what`).
pub fn finished_as<C: PipelineContract>(
    state: i32,
    result: Option<gw::RunResult>,
    what: &'static str,
) -> Result<C::Result, NoResult> {
    match finished(state, result) {
        Ok(r) => C::result(r).ok_or(NoResult::Missing(what)),
        Err(NoResult::Missing(_)) => Err(NoResult::Missing(what)),
        Err(e) => Err(e),
    }
}

/// A run's event stream that broke off: the status, and, once the run is known, that it goes on
/// in the gateway and how to follow it (the run belongs to the gateway, not to this stream).
pub fn interrupted(s: &tonic::Status, run_id: &str) -> String {
    let transport = std::error::Error::source(s).is_some();
    let text =
        if transport { format!("lost the connection to the gateway: {}", status_text(s)) } else { status_text(s) };
    if run_id.is_empty() {
        return text;
    }
    format!(
        "{text}\nrun {run_id} is stored in the gateway and goes on there (or resumes when the gateway restarts): \
         `assay runs watch {run_id}` follows it, `assay runs show {run_id}` shows it"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_finished_runs_are_final() {
        for s in [gw::RunState::Succeeded, gw::RunState::Partial, gw::RunState::Failed, gw::RunState::Cancelled] {
            assert!(is_final(s as i32), "{s:?}");
        }
        for s in [gw::RunState::Pending, gw::RunState::Running, gw::RunState::Paused, gw::RunState::AwaitingHuman] {
            assert!(!is_final(s as i32), "{s:?}");
        }
        assert!(!is_final(99));
    }

    #[test]
    fn a_finished_run_gives_its_result_or_why_not() {
        let done = |error: &str, result| Some(gw::RunResult { result, error: error.into() });
        let checklist = Some(gw::run_result::Result::Checklist(Default::default()));
        let ok = finished(gw::RunState::Succeeded as i32, done("", checklist.clone()));
        assert!(matches!(ok, Ok(gw::run_result::Result::Checklist(_))));
        assert_eq!(finished(gw::RunState::Cancelled as i32, None), Err(NoResult::Cancelled));
        let failed = finished(gw::RunState::Failed as i32, done("scorer down", None)).unwrap_err();
        assert_eq!(failed.message("r1"), "run r1 failed: scorer down");
        assert_eq!(
            finished(gw::RunState::Failed as i32, None).unwrap_err().message("r1"),
            "run r1 failed: no reason given"
        );
        assert_eq!(
            finished(gw::RunState::Partial as i32, done("half", checklist)),
            Err(NoResult::Failed("half".into()))
        );
        assert_eq!(finished(gw::RunState::Succeeded as i32, done("", None)), Err(NoResult::Missing("result")));
        // Every record failed: the run failed, and its result says why per record.
        let all_failed = finished(
            gw::RunState::Failed as i32,
            done("", Some(gw::run_result::Result::ChecklistEval(Default::default()))),
        );
        assert!(matches!(all_failed, Ok(gw::run_result::Result::ChecklistEval(_))));
        let running = finished(gw::RunState::Running as i32, None).unwrap_err();
        assert_eq!(running.message("r1"), "run r1 completed in state running");
    }

    #[test]
    fn a_broken_stream_says_how_to_follow_the_run() {
        let s = tonic::Status::unavailable("connection reset");
        assert_eq!(interrupted(&s, ""), "UNAVAILABLE: connection reset", "before the run is known: the status");
        let text = interrupted(&s, "01run");
        assert!(text.starts_with("UNAVAILABLE: connection reset\nrun 01run is stored in the gateway"), "{text}");
        assert!(text.contains("`assay runs watch 01run`"), "{text}");
    }
}
