//! `assay runs`: list, show, watch and control runs on a running gateway.

use assay_config::AssayConfig;
use assay_proto::gateway::v1 as gw;
use serde_json::{Value, json};

use super::render::{checklist_json, record_json};
use super::{client, status_text};

/// What to do.
pub enum Action {
    List { limit: u32, state: Option<String> },
    Show { run_id: String },
    Watch { run_id: String, after: u64 },
    Pause { run_id: String },
    Resume { run_id: String },
    Cancel { run_id: String },
}

fn lower(name: &str, prefix: &str) -> String {
    name.trim_start_matches(prefix).to_lowercase()
}

fn state_name(s: i32) -> String {
    gw::RunState::try_from(s).map_or_else(|_| s.to_string(), |s| lower(s.as_str_name(), "RUN_STATE_"))
}

fn kind_name(k: i32) -> String {
    gw::PipelineKind::try_from(k).map_or_else(|_| k.to_string(), |k| lower(k.as_str_name(), "PIPELINE_KIND_"))
}

fn time(t: Option<prost_types::Timestamp>) -> String {
    t.map(|t| t.to_string()).unwrap_or_default()
}

/// A run summary as JSON.
pub fn run_json(r: &gw::Run) -> Value {
    let u = r.usage.unwrap_or_default();
    let mut v = json!({
        "run_id": r.run_id, "kind": kind_name(r.kind), "state": state_name(r.state), "label": r.label,
        "created_at": time(r.created_at), "updated_at": time(r.updated_at), "last_sequence": r.last_sequence,
        "records_total": r.records_total, "records_done": r.records_done,
        "usage": {"calls": u.calls, "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens, "cache_hits": u.cache_hits},
    });
    if let Some(result) = &r.result {
        if !result.error.is_empty() {
            v["error"] = json!(result.error);
        }
        match &result.result {
            Some(gw::run_result::Result::ChecklistEval(e)) => {
                let a = e.aggregate.clone().unwrap_or_default();
                v["aggregate"] = json!({"targets": a.targets, "mean_primary_score": a.mean_primary_score,
                    "macro_pass_rate": a.macro_pass_rate, "micro_pass_rate": a.micro_pass_rate,
                    "unanswered_items": a.unanswered_items});
                v["failed_records"] = json!(e.results.iter().filter(|r| r.score.is_none()).count());
            }
            Some(gw::run_result::Result::Checklist(c)) => v["checklist"] = checklist_json(c),
            Some(
                gw::run_result::Result::SelfRefine(_)
                | gw::run_result::Result::Debate(_)
                | gw::run_result::Result::TargetedRefinement(_),
            )
            | None => {}
        }
    }
    v
}

fn event_json(e: &gw::RunEvent) -> Value {
    use gw::run_event::Event;
    let (kind, detail) = match &e.event {
        Some(Event::Started(s)) => ("started", json!({"kind": kind_name(s.kind), "records": s.records})),
        Some(Event::Progress(p)) => {
            let pr = p.progress.clone().unwrap_or_default();
            (
                "progress",
                json!({"service": p.service, "stage": pr.stage, "message": pr.message, "done": pr.done, "total": pr.total}),
            )
        }
        Some(Event::ChecklistReady(c)) => (
            "checklist_ready",
            json!({"checklist_id": c.checklist.as_ref().map(|c| c.id.clone()), "items": c.checklist.as_ref().map_or(0, |c| c.items.len()), "records": c.record_indices.len()}),
        ),
        Some(Event::RecordScored(r)) => ("record_scored", record_json(r)),
        Some(Event::Aggregate(a)) => {
            let a = a.aggregate.clone().unwrap_or_default();
            (
                "aggregate",
                json!({"mean_primary_score": a.mean_primary_score, "macro_pass_rate": a.macro_pass_rate, "micro_pass_rate": a.micro_pass_rate}),
            )
        }
        Some(Event::StateChanged(s)) => ("state_changed", json!({"state": state_name(s.state), "reason": s.reason})),
        Some(Event::Completed(c)) => {
            ("completed", json!({"state": state_name(c.state), "error": c.result.as_ref().map(|r| r.error.clone())}))
        }
        Some(Event::Refinement(r)) => (
            "refinement",
            json!({"type": r.r#type, "iteration": r.iteration, "section_id": r.section_id, "detail": r.detail}),
        ),
        Some(Event::SelfRefinePass(p)) => ("self_refine_pass", json!({"pass": p.pass, "converged": p.converged})),
        Some(Event::DebateStage(_)) => ("debate_stage", Value::Null),
        None => ("unknown", Value::Null),
    };
    json!({"sequence": e.sequence, "time": time(e.time), "event": kind, "detail": detail})
}

/// Run the action against the gateway at `url`.
pub async fn run(config: &AssayConfig, url: &str, action: Action, as_json: bool) -> Result<(), String> {
    let mut c = client(config, url)?;
    let control = |run_id: String, action: gw::control_run_request::Action| gw::ControlRunRequest {
        run_id,
        action: Some(action),
        actor: std::env::var("USER").unwrap_or_else(|_| "assay-cli".into()),
        reason: "assay runs".into(),
    };
    let print_run = |r: &gw::Run| {
        if as_json {
            println!("{}", run_json(r));
        } else {
            println!(
                "{}  {:<18} {:<10} {}/{} records  {}",
                r.run_id,
                kind_name(r.kind),
                state_name(r.state),
                r.records_done,
                r.records_total,
                r.label
            );
        }
    };
    match action {
        Action::List { limit, state } => {
            let state = match state {
                None => gw::RunState::Unspecified,
                Some(s) => {
                    gw::RunState::from_str_name(&format!("RUN_STATE_{}", s.to_ascii_uppercase())).ok_or_else(|| {
                        format!("unknown state {s:?} (running, paused, succeeded, partial, failed, cancelled)")
                    })?
                }
            };
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
                    print_run(r);
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
            let run = r.run.unwrap_or_default();
            if as_json {
                println!("{}", run_json(&run));
            } else {
                println!("{}", serde_json::to_string_pretty(&run_json(&run)).map_err(|e| e.to_string())?);
            }
        }
        Action::Watch { run_id, after } => {
            let mut s = c
                .watch_run(gw::WatchRunRequest { run_id, after_sequence: after })
                .await
                .map_err(|s| status_text(&s))?
                .into_inner();
            while let Some(m) = s.message().await.map_err(|s| status_text(&s))? {
                if let Some(e) = m.event {
                    let v = event_json(&e);
                    if as_json {
                        println!("{v}");
                    } else {
                        println!("#{} {} {}", e.sequence, v["event"].as_str().unwrap_or_default(), v["detail"]);
                    }
                }
            }
        }
        Action::Pause { run_id } => print_run(
            &c.control_run(control(run_id, gw::control_run_request::Action::Pause(gw::PauseRun {})))
                .await
                .map_err(|s| status_text(&s))?
                .into_inner()
                .run
                .unwrap_or_default(),
        ),
        Action::Resume { run_id } => print_run(
            &c.control_run(control(run_id, gw::control_run_request::Action::Resume(gw::ResumeRun {})))
                .await
                .map_err(|s| status_text(&s))?
                .into_inner()
                .run
                .unwrap_or_default(),
        ),
        Action::Cancel { run_id } => print_run(
            &c.control_run(control(run_id, gw::control_run_request::Action::Cancel(gw::CancelRun {})))
                .await
                .map_err(|s| status_text(&s))?
                .into_inner()
                .run
                .unwrap_or_default(),
        ),
    }
    Ok(())
}
