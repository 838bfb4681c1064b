//! `assay runs`: list, show, watch and control runs on a running gateway; the human-in-the-loop
//! verbs of targeted refinement (intervene, edit, resume, accept, review). JSON is the proto3 JSON
//! mapping of the gateway's messages ([`render::json`](super::render::json)); human lines are the
//! pipelines' own ([`render`](super::render)).

use std::path::{Path, PathBuf};

use assay_config::AssayConfig;
use assay_proto::gateway::v1 as gw;
use serde_json::Value;

use super::common::{BackendArgs, load_config};
use super::error::{CliError, Ending, Outcome, status_text};
use super::render::events;
use super::render::json::to_json;
use super::render::{kind_name, state_name};
use super::session::{Client, client, configured_gateway};
use super::source::write_results;

/// Options of `assay runs`.
#[derive(clap::Args, Clone)]
pub struct RunsArgs {
    #[command(subcommand)]
    pub command: RunsCommand,
    /// Gateway address (default: the configured gateway port on this machine).
    #[arg(long, global = true)]
    pub gateway: Option<String>,
    /// JSON output: the gateway's messages in the proto3 JSON mapping (lowerCamelCase names,
    /// enums by name, 64-bit integers as strings), as the admin page shows them.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(clap::Subcommand, Clone)]
pub enum RunsCommand {
    /// Most recent runs first.
    List {
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Only runs in this state (running, paused, awaiting_human, succeeded, partial, failed,
        /// cancelled).
        #[arg(long)]
        state: Option<String>,
    },
    /// One run as the gateway stores it: progress and result (a refinement with its document).
    Show { run_id: String },
    /// Replay a run's events after a sequence number, then follow it until it completes.
    Watch {
        run_id: String,
        #[arg(long, default_value_t = 0)]
        after: u64,
    },
    /// Start no new work until resumed.
    Pause {
        run_id: String,
        #[command(flatten)]
        who: WhoArgs,
    },
    /// Resume a paused run; an escalated refinement (edited or not) is judged again and goes on.
    Resume {
        run_id: String,
        #[command(flatten)]
        who: WhoArgs,
    },
    /// Stop the run for good: calls in flight are dropped.
    Cancel {
        run_id: String,
        #[command(flatten)]
        who: WhoArgs,
    },
    /// Take over a refinement: pause it after the current task so its sections can be edited.
    Intervene {
        run_id: String,
        #[command(flatten)]
        who: WhoArgs,
    },
    /// Replace one section of a paused (or waiting) refinement; verified before the run goes on.
    Edit {
        run_id: String,
        /// The section's id.
        #[arg(long)]
        section: String,
        /// The new content.
        #[arg(long, conflicts_with = "file", required_unless_present = "file")]
        content: Option<String>,
        /// A file holding the new content.
        #[arg(long)]
        file: Option<PathBuf>,
        #[command(flatten)]
        who: WhoArgs,
    },
    /// Accept a paused or waiting refinement's content as it stands (outcome accepted_manual).
    Accept {
        run_id: String,
        #[command(flatten)]
        who: WhoArgs,
    },
    /// Mark an escalated refinement as reviewed: accepted with human approval (outcome reviewed).
    Review {
        run_id: String,
        #[command(flatten)]
        who: WhoArgs,
    },
    /// A checklist_eval run's results, one JSON line per record in record order (the lines of
    /// `assay eval --out`), read a page at a time: any run size.
    Results {
        run_id: String,
        /// Write them to this file instead of standard output.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Delete finished runs with their events and audit entries: the ones named, and with
    /// --older-than every finished run created longer ago than that. A run still executing is
    /// refused (cancel it first). Exit code 1 when any named run could not be deleted.
    Delete {
        run_ids: Vec<String>,
        /// Also every finished run created more than this long ago: 30d, 12h, 90m, 2w.
        #[arg(long, value_parser = parse_age)]
        older_than: Option<std::time::Duration>,
        /// List what would be deleted, delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

// Who acts on a run and why (the refinement's audit log). A plain comment: a doc comment here would
// replace the help of the last subcommand that flattens it.
#[derive(clap::Args, Clone)]
pub struct WhoArgs {
    /// Why (default "assay runs <verb>").
    #[arg(long)]
    reason: Option<String>,
    /// Who (default $USER, else "cli").
    #[arg(long)]
    actor: Option<String>,
}

impl WhoArgs {
    fn into_who(self) -> Who {
        Who { actor: self.actor, reason: self.reason }
    }
}

impl RunsCommand {
    fn into_action(self) -> Action {
        let control = |run_id: String, verb: Verb, who: WhoArgs| Action::Control { run_id, verb, who: who.into_who() };
        match self {
            RunsCommand::List { limit, state } => Action::List { limit, state },
            RunsCommand::Show { run_id } => Action::Show { run_id },
            RunsCommand::Watch { run_id, after } => Action::Watch { run_id, after },
            RunsCommand::Pause { run_id, who } | RunsCommand::Intervene { run_id, who } => {
                control(run_id, Verb::Pause, who)
            }
            RunsCommand::Resume { run_id, who } => control(run_id, Verb::Resume, who),
            RunsCommand::Cancel { run_id, who } => control(run_id, Verb::Cancel, who),
            RunsCommand::Accept { run_id, who } => control(run_id, Verb::Accept, who),
            RunsCommand::Review { run_id, who } => control(run_id, Verb::Review, who),
            RunsCommand::Delete { run_ids, older_than, dry_run } => Action::Delete { run_ids, older_than, dry_run },
            RunsCommand::Results { run_id, out } => Action::Results { run_id, out },
            RunsCommand::Edit { run_id, section, content, file, who } => {
                let content = match (content, file) {
                    (Some(text), _) => EditContent::Text(text),
                    (None, Some(path)) => EditContent::File(path),
                    // clap requires one of the two; an empty text is refused with a clear message.
                    (None, None) => EditContent::Text(String::new()),
                };
                control(run_id, Verb::Edit { section_id: section, content }, who)
            }
        }
    }
}

/// `assay runs` with the configuration at `config` (`--config`): 0 done, 1 the action failed (this
/// verb does not tell bad input apart).
pub async fn run(config: Option<&Path>, args: RunsArgs) -> Outcome {
    let config = load_config(config, &BackendArgs::default())?;
    let url = args.gateway.unwrap_or_else(|| configured_gateway(&config));
    act(&config, &url, args.command.into_action(), args.json).await.map_err(CliError::Failed)?;
    Ok(Ending::Done)
}

/// What to do.
pub enum Action {
    List {
        limit: u32,
        state: Option<String>,
    },
    Show {
        run_id: String,
    },
    Watch {
        run_id: String,
        after: u64,
    },
    /// A `ControlRun` call.
    Control {
        run_id: String,
        verb: Verb,
        who: Who,
    },
    /// A checklist_eval run's results, one JSON line per record, read a page at a time.
    Results {
        run_id: String,
        out: Option<std::path::PathBuf>,
    },
    /// `DeleteRun` calls: the runs named, and every finished run older than `older_than`.
    Delete {
        run_ids: Vec<String>,
        older_than: Option<std::time::Duration>,
        dry_run: bool,
    },
}

/// An age as `--older-than` takes it: a whole number and a unit, s, m, h, d or w (`30d`).
pub fn parse_age(text: &str) -> Result<std::time::Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => return Err(format!("{text:?}: expected a whole number and a unit (s, m, h, d, w), e.g. 30d")),
    };
    let n: u64 = number.parse().map_err(|_| format!("{text:?}: expected a whole number before the unit, e.g. 30d"))?;
    n.checked_mul(seconds).map(std::time::Duration::from_secs).ok_or_else(|| format!("{text:?}: too long an age"))
}

/// The finished runs created before `cutoff` (seconds since the Unix epoch), from every page of
/// ListRuns.
async fn finished_before(c: &mut Client, cutoff: i64) -> Result<Vec<gw::Run>, String> {
    let mut out = Vec::new();
    let mut token = String::new();
    loop {
        let page = c
            .list_runs(gw::ListRunsRequest { page_size: 500, page_token: token, kind: 0, state: 0 })
            .await
            .map_err(|s| status_text(&s))?
            .into_inner();
        out.extend(
            page.runs
                .into_iter()
                .filter(|r| r.created_at.is_some_and(|t| t.seconds < cutoff) && super::follow::is_final(r.state)),
        );
        if page.next_page_token.is_empty() {
            return Ok(out);
        }
        token = page.next_page_token;
    }
}

/// Delete the runs named and, with `older_than`, the finished runs older than that; one line per
/// run. Fails (after trying every one) when a named run could not be deleted.
async fn delete(
    c: &mut Client,
    run_ids: Vec<String>,
    older_than: Option<std::time::Duration>,
    dry_run: bool,
    as_json: bool,
) -> Result<(), String> {
    if run_ids.is_empty() && older_than.is_none() {
        return Err("name the runs to delete (RUN_ID...) or give --older-than".into());
    }
    if let Some(blank) = run_ids.iter().position(|r| r.trim().is_empty()) {
        return Err(format!("RUN_ID {} must not be empty", blank + 1));
    }
    let mut targets: Vec<(String, bool)> = run_ids.into_iter().map(|r| (r, true)).collect();
    if let Some(age) = older_than {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let cutoff = i64::try_from(now.saturating_sub(age).as_secs()).unwrap_or(i64::MAX);
        for r in finished_before(c, cutoff).await? {
            if !targets.iter().any(|(id, _)| *id == r.run_id) {
                targets.push((r.run_id, false));
            }
        }
    }
    let mut failed = 0usize;
    for (run_id, named) in &targets {
        if dry_run {
            if as_json {
                outln!("{}", serde_json::json!({"runId": run_id, "deleted": false, "dryRun": true}));
            } else {
                outln!("would delete {run_id}");
            }
            continue;
        }
        match c.delete_run(gw::DeleteRunRequest { run_id: run_id.clone() }).await {
            Ok(reply) => {
                let run = reply.into_inner().run.unwrap_or_default();
                if as_json {
                    outln!("{}", serde_json::json!({"runId": run_id, "deleted": true, "run": to_json(&run)?}));
                } else {
                    outln!("deleted {}", run_line(&run));
                }
            }
            // A run listed by age and deleted meanwhile (retention, another client) is not an error.
            Err(s) if !named && s.code() == tonic::Code::NotFound => {}
            Err(s) => {
                failed += usize::from(*named);
                let why = status_text(&s);
                if as_json {
                    outln!("{}", serde_json::json!({"runId": run_id, "deleted": false, "error": why}));
                } else {
                    outln!("not deleted {run_id}: {why}");
                }
            }
        }
    }
    if failed > 0 {
        return Err(format!("{failed} of the runs named could not be deleted"));
    }
    Ok(())
}

/// A `ControlRun` action.
pub enum Verb {
    /// Start no new work until resumed (`pause`, `intervene`).
    Pause,
    Resume,
    Cancel,
    /// Accept the current content as final (targeted refinement).
    Accept,
    /// Mark an escalated refinement as reviewed (targeted refinement).
    Review,
    /// Replace one section's content (targeted refinement, paused or awaiting a human).
    Edit {
        section_id: String,
        content: EditContent,
    },
}

/// Where an edited section's new content comes from.
pub enum EditContent {
    Text(String),
    File(PathBuf),
}

/// Who acts and why, for the run's audit log.
#[derive(Default)]
pub struct Who {
    /// Default: `$USER`, else "cli".
    pub actor: Option<String>,
    /// Default: "assay runs <verb>".
    pub reason: Option<String>,
}

impl Verb {
    fn name(&self) -> &'static str {
        match self {
            Verb::Pause => "pause",
            Verb::Resume => "resume",
            Verb::Cancel => "cancel",
            Verb::Accept => "accept",
            Verb::Review => "review",
            Verb::Edit { .. } => "edit",
        }
    }
}

/// The actor recorded in the audit log: `--actor`, else `$USER`, else "cli".
fn actor(given: Option<String>) -> String {
    given
        .or_else(|| std::env::var("USER").ok())
        .map(|a| a.trim().to_string())
        .filter(|a| !a.is_empty())
        .unwrap_or_else(|| "cli".into())
}

/// The new content of an edited section: the text given or the file's, never blank.
fn edit_content(content: EditContent) -> Result<String, String> {
    let (text, what) = match content {
        EditContent::Text(t) => (t, "--content".to_string()),
        EditContent::File(p) => {
            (std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?, p.display().to_string())
        }
    };
    if text.trim().is_empty() {
        return Err(format!("{what}: the section's new content must not be empty"));
    }
    Ok(text)
}

/// The `ControlRun` request of a verb.
pub fn control_request(run_id: String, verb: Verb, who: Who) -> Result<gw::ControlRunRequest, String> {
    use gw::control_run_request::Action as A;
    if run_id.trim().is_empty() {
        return Err("RUN_ID must not be empty".into());
    }
    let reason = who.reason.unwrap_or_else(|| format!("assay runs {}", verb.name()));
    let action = match verb {
        Verb::Pause => A::Pause(gw::PauseRun {}),
        Verb::Resume => A::Resume(gw::ResumeRun {}),
        Verb::Cancel => A::Cancel(gw::CancelRun {}),
        Verb::Accept => A::Accept(gw::AcceptRun {}),
        Verb::Review => A::Review(gw::ReviewRun {}),
        Verb::Edit { section_id, content } => {
            if section_id.trim().is_empty() {
                return Err("--section must not be empty".into());
            }
            A::EditSection(gw::EditSection { section_id, content: edit_content(content)? })
        }
    };
    Ok(gw::ControlRunRequest { run_id, action: Some(action), actor: actor(who.actor), reason })
}

/// One line per run, as `runs list` prints it (a refinement with its iteration, score and phase).
fn run_line(r: &gw::Run) -> String {
    let head = format!("{}  {:<20} {:<14}", r.run_id, kind_name(r.kind), state_name(r.state));
    match &r.progress {
        Some(gw::run::Progress::Refinement(p)) => {
            let score = p.score_history.last().map_or_else(|| "-".to_string(), |s| format!("{s:.2}"));
            format!("{head} iteration {}/{} score {score} {}  {}", p.iteration, p.max_iterations, p.phase, r.label)
        }
        None => format!(
            "{head} {}/{} records  {}  {}",
            r.records_done,
            r.records_total,
            r.usage.as_ref().map_or_else(String::new, super::render::cost_text),
            r.label
        ),
    }
}

/// A message as `runs show` and the control verbs print it: the proto3 JSON mapping, one line with
/// `--json`, indented without.
fn print_json(v: &Value, as_json: bool) -> Result<(), String> {
    if as_json {
        outln!("{v}");
    } else {
        outln!("{}", serde_json::to_string_pretty(v).map_err(|e| e.to_string())?);
    }
    Ok(())
}

/// The state filter of `runs list` (`awaiting_human`).
fn state_filter(state: Option<&str>) -> Result<gw::RunState, String> {
    let Some(s) = state else { return Ok(gw::RunState::Unspecified) };
    gw::RunState::from_str_name(&format!("RUN_STATE_{}", s.to_ascii_uppercase())).ok_or_else(|| {
        format!("unknown state {s:?} (running, paused, awaiting_human, succeeded, partial, failed, cancelled)")
    })
}

/// Run the action against the gateway at `url`.
async fn act(config: &AssayConfig, url: &str, action: Action, as_json: bool) -> Result<(), String> {
    let mut c = client(config, url).map_err(CliError::into_message)?;
    match action {
        Action::List { limit, state } => {
            let state = state_filter(state.as_deref())?;
            let mut token = String::new();
            let mut shown = 0u32;
            loop {
                let page = c
                    .list_runs(gw::ListRunsRequest {
                        page_size: (limit - shown).min(500),
                        page_token: token.clone(),
                        kind: 0,
                        state: state as i32,
                    })
                    .await
                    .map_err(|s| status_text(&s))?
                    .into_inner();
                for r in &page.runs {
                    if as_json {
                        outln!("{}", to_json(r)?);
                    } else {
                        outln!("{}", run_line(r));
                    }
                    shown += 1;
                }
                if page.next_page_token.is_empty() || shown >= limit {
                    break;
                }
                token = page.next_page_token;
            }
        }
        Action::Show { run_id } => {
            let r = c.get_run(gw::GetRunRequest { run_id }).await.map_err(|s| status_text(&s))?.into_inner();
            print_json(&to_json(&r.run.unwrap_or_default())?, as_json)?;
        }
        Action::Watch { run_id, after } => {
            let mut s = c
                .watch_run(gw::WatchRunRequest { run_id, after_sequence: after })
                .await
                .map_err(|s| status_text(&s))?
                .into_inner();
            while let Some(m) = s.message().await.map_err(|s| status_text(&s))? {
                if let Some(e) = m.event {
                    outln!("{}", watch_line(&e, as_json)?);
                }
            }
        }
        Action::Control { run_id, verb, who } => {
            let request = control_request(run_id, verb, who)?;
            let reply = c.control_run(request).await.map_err(|s| status_text(&s))?.into_inner();
            print_json(&to_json(&reply.run.unwrap_or_default())?, as_json)?;
        }
        Action::Delete { run_ids, older_than, dry_run } => {
            delete(&mut c, run_ids, older_than, dry_run, as_json).await?
        }
        Action::Results { run_id, out } => {
            let mut out: Box<dyn std::io::Write> = match &out {
                Some(p) => Box::new(std::io::BufWriter::new(
                    std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?,
                )),
                None => Box::new(std::io::stdout().lock()),
            };
            write_results(&mut c, &run_id, &mut out).await?;
        }
    }
    Ok(())
}

/// One watched event: the event in the proto3 JSON mapping, or `#<sequence> <line>` in the words
/// of [`events::line`] (the one place every kind is worded).
fn watch_line(e: &gw::RunEvent, as_json: bool) -> Result<String, String> {
    if as_json {
        return Ok(to_json(e)?.to_string());
    }
    Ok(format!("#{} {}", e.sequence, events::line(e)))
}

#[cfg(test)]
mod tests {
    use assay_proto::common::v1 as common;
    use assay_proto::refiners::v1 as ref_pb;
    use serde_json::json;

    use super::*;

    fn event(sequence: u64, event: gw::run_event::Event) -> gw::RunEvent {
        gw::RunEvent { run_id: "r1".into(), sequence, event: Some(event), ..Default::default() }
    }

    #[test]
    fn watched_events_are_the_proto_mapping_or_the_verbs_words() {
        use gw::refinement_event::Event as E;
        let verified = event(
            5,
            gw::run_event::Event::Refinement(gw::RefinementEvent {
                iteration: 2,
                event: Some(E::VerificationResult(gw::VerificationResult {
                    task_id: "t1".into(),
                    section_id: "intro".into(),
                    rolled_back: true,
                    reason: "length ratio 2.4".into(),
                    ..Default::default()
                })),
            }),
        );
        let v: Value = serde_json::from_str(&watch_line(&verified, true).unwrap()).unwrap();
        assert_eq!((v["runId"].as_str(), v["sequence"].as_str()), (Some("r1"), Some("5")));
        let r = &v["refinement"];
        assert_eq!(r["iteration"], 2);
        assert_eq!(r["verificationResult"]["rolledBack"], true);
        assert_eq!(r["verificationResult"]["reason"], "length ratio 2.4");
        assert_eq!(watch_line(&verified, false).unwrap(), "#5 verified intro: rejected: length ratio 2.4, rolled back");
        let pass = ref_pb::SelfRefinePass {
            pass: 2,
            critique: vec!["Too vague".into()],
            char_similarity: 0.994,
            decided_by: "char".into(),
            converged: true,
            ..Default::default()
        };
        let passed = event(4, gw::run_event::Event::SelfRefinePass(pass));
        let v: Value = serde_json::from_str(&watch_line(&passed, true).unwrap()).unwrap();
        assert_eq!(
            (v["selfRefinePass"]["pass"].as_u64(), v["selfRefinePass"]["decidedBy"].as_str()),
            (Some(2), Some("char"))
        );
        assert_eq!(v["selfRefinePass"]["critique"], json!(["Too vague"]));
        assert_eq!(
            watch_line(&passed, false).unwrap(),
            "#4 pass 2: 1 critique point; similarity 0.99 (char); converged"
        );
        let hooked = event(
            9,
            gw::run_event::Event::SelfRefined(gw::SelfRefined {
                target: "intro".into(),
                producer: "original".into(),
                skipped: "too_short".into(),
                ..Default::default()
            }),
        );
        assert_eq!(watch_line(&hooked, false).unwrap(), "#9 self-refine intro (original): skipped: too_short");
        let started = event(1, gw::run_event::Event::Started(gw::RunStarted { records: 3, ..Default::default() }));
        assert_eq!(watch_line(&started, false).unwrap(), "#1 run started: 3 units of work");
        let claimed = event(
            2,
            gw::run_event::Event::RecordsClaimed(gw::RecordsClaimed {
                gateway: "g2".into(),
                first: 10000,
                count: 5000,
                takeover: true,
            }),
        );
        assert_eq!(
            watch_line(&claimed, false).unwrap(),
            "#2 records 10000-14999 claimed by gateway g2 (taken over from an expired claim)"
        );
    }

    #[test]
    fn a_watched_completion_reads_the_finished_run() {
        let done = |state: gw::RunState, error: &str| {
            event(
                7,
                gw::run_event::Event::Completed(gw::RunCompleted {
                    state: state as i32,
                    result: Some(gw::RunResult {
                        result: Some(gw::run_result::Result::Checklist(common::Checklist::default())),
                        error: error.into(),
                    }),
                }),
            )
        };
        assert_eq!(watch_line(&done(gw::RunState::Succeeded, ""), false).unwrap(), "#7 completed: succeeded");
        assert_eq!(
            watch_line(&done(gw::RunState::Failed, "generator down"), false).unwrap(),
            "#7 completed: run r1 failed: generator down"
        );
        assert_eq!(
            watch_line(&done(gw::RunState::Cancelled, ""), false).unwrap(),
            "#7 completed: run r1 was cancelled"
        );
    }

    #[test]
    fn a_run_shows_its_progress_result_and_document_in_the_proto_mapping() {
        let run = gw::Run {
            run_id: "r1".into(),
            kind: gw::PipelineKind::TargetedRefinement as i32,
            state: gw::RunState::AwaitingHuman as i32,
            progress: Some(gw::run::Progress::Refinement(gw::RefinementProgress {
                iteration: 2,
                max_iterations: 3,
                score_history: vec![0.6, 0.7],
                quality: gw::QualityStatus::BelowStandard as i32,
                mode: gw::RefinementMode::SemiAuto as i32,
                phase: "awaiting_human".into(),
                sections: vec![common::Section { id: "a".into(), content: "text".into(), ..Default::default() }],
                ..Default::default()
            })),
            result: Some(gw::RunResult {
                result: Some(gw::run_result::Result::TargetedRefinement(gw::TargetedRefinementResult {
                    outcome: gw::RefinementOutcome::Reviewed as i32,
                    audit_log: vec![gw::AuditEntry {
                        actor: "alice".into(),
                        action: "review".into(),
                        ..Default::default()
                    }],
                    self_refined: vec![gw::SelfRefined {
                        target: "intro".into(),
                        skipped: "too_short".into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                })),
                error: String::new(),
            }),
            ..Default::default()
        };
        let v = to_json(&run).unwrap();
        assert_eq!(v["state"], "RUN_STATE_AWAITING_HUMAN");
        assert_eq!(v["kind"], "PIPELINE_KIND_TARGETED_REFINEMENT");
        assert_eq!(v["refinement"]["quality"], "QUALITY_STATUS_BELOW_STANDARD");
        assert_eq!(v["refinement"]["mode"], "REFINEMENT_MODE_SEMI_AUTO");
        assert_eq!(v["refinement"]["scoreHistory"], json!([0.6, 0.7]));
        assert_eq!(v["refinement"]["sections"][0]["content"], "text");
        let result = &v["result"]["targetedRefinement"];
        assert_eq!(result["outcome"], "REFINEMENT_OUTCOME_REVIEWED");
        assert_eq!(result["auditLog"][0]["actor"], "alice");
        assert_eq!(
            (result["selfRefined"][0]["target"].as_str(), result["selfRefined"][0]["skipped"].as_str()),
            (Some("intro"), Some("too_short"))
        );
        let self_refine = gw::Run {
            kind: gw::PipelineKind::SelfRefine as i32,
            result: Some(gw::RunResult {
                result: Some(gw::run_result::Result::SelfRefine(ref_pb::SelfRefineResponse {
                    final_text: "Final.".into(),
                    stop_reason: ref_pb::SelfRefineStopReason::Converged as i32,
                    ..Default::default()
                })),
                error: String::new(),
            }),
            ..run
        };
        let v = to_json(&self_refine).unwrap();
        assert_eq!(v["result"]["selfRefine"]["stopReason"], "SELF_REFINE_STOP_REASON_CONVERGED");
        assert_eq!(v["result"]["selfRefine"]["finalText"], "Final.");
    }

    #[test]
    fn ages_take_a_whole_number_and_a_unit() {
        assert_eq!(parse_age("30d").unwrap().as_secs(), 30 * 86_400);
        assert_eq!(parse_age("2w").unwrap().as_secs(), 14 * 86_400);
        assert_eq!(parse_age("90m").unwrap().as_secs(), 5400);
        assert_eq!(parse_age("0s").unwrap().as_secs(), 0);
        for bad in ["30", "d", "1.5d", "-1d", "30 days", "99999999999999999999d"] {
            assert!(parse_age(bad).unwrap_err().contains(bad), "{bad}");
        }
    }

    #[test]
    fn control_requests_carry_the_action_actor_and_reason() {
        let who = Who { actor: Some("alice".into()), reason: Some("fix the dates".into()) };
        let edit = Verb::Edit { section_id: "intro".into(), content: EditContent::Text("New text.".into()) };
        let r = control_request("run-1".into(), edit, who).unwrap();
        assert_eq!((r.actor.as_str(), r.reason.as_str()), ("alice", "fix the dates"));
        assert_eq!(
            r.action,
            Some(gw::control_run_request::Action::EditSection(gw::EditSection {
                section_id: "intro".into(),
                content: "New text.".into()
            }))
        );
        let r = control_request("run-1".into(), Verb::Review, Who::default()).unwrap();
        assert_eq!(r.reason, "assay runs review");
        assert!(!r.actor.is_empty());
        let blank = Verb::Edit { section_id: "intro".into(), content: EditContent::Text("  ".into()) };
        assert!(control_request("run-1".into(), blank, Who::default()).unwrap_err().contains("must not be empty"));
        let missing = Verb::Edit { section_id: "intro".into(), content: EditContent::File("/no/such/file".into()) };
        assert!(control_request("run-1".into(), missing, Who::default()).unwrap_err().starts_with("/no/such/file"));
    }
}
