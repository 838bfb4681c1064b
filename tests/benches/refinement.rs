//! Targeted refinement on the 5-section lesson (`examples/lesson.json`) through the whole mesh,
//! against the scripted backend. Run: `cargo bench -p assay-tests --bench refinement`.
//!
//! The scripted judges find a clarity problem in three non-adjacent sections (intro, example,
//! summary) until a refiner has revised them; with `structure` on, they also score
//! pedagogical_structure 0.5, which makes the arbiter regenerate the whole document. Token counts
//! are the scripted server's (characters / 4 of each prompt and reply), per call kind.
//!
//! Prints: tokens of the refinement iteration (edits, verification, re-judging, planning) for
//! targeted fixes vs FULL_REGENERATE of the same document, and the wall time of the targeted run
//! at 50 ms a call with the three patches in one parallel batch vs one task at a time.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use assay_proto::common::v1 as pb;
use assay_proto::gateway::v1 as gw;
use assay_testkit::{RecordedRequest, Reply, hash_embedding};
use assay_tests::{MeshSandbox, run_to_end};
use serde_json::{Value, json};

/// Sections with a problem: one (a factual error in section 2) or
/// three non-adjacent ones (one parallel batch).
const ONE: &[&str] = &["stages"];
const THREE: &[&str] = &["intro", "example", "summary"];

fn lesson() -> (Vec<pb::Section>, pb::Brief) {
    let doc: Value = serde_json::from_str(include_str!("../../examples/lesson.json")).expect("lesson parses");
    let sections = doc["sections"]
        .as_array()
        .expect("sections")
        .iter()
        .enumerate()
        .map(|(i, s)| pb::Section {
            id: s["id"].as_str().unwrap_or_default().into(),
            index: i as u32,
            title: s["title"].as_str().unwrap_or_default().into(),
            content: s["content"].as_str().unwrap_or_default().into(),
        })
        .collect();
    let b = &doc["brief"];
    let brief = pb::Brief {
        objectives: b["objectives"]
            .as_array()
            .map(|o| o.iter().filter_map(|x| x.as_str().map(String::from)).collect())
            .unwrap_or_default(),
        audience: b["audience"].as_str().unwrap_or_default().into(),
        language: b["language"].as_str().unwrap_or_default().into(),
        description: b["description"].as_str().unwrap_or_default().into(),
    };
    (sections, brief)
}

fn marker(id: &str) -> String {
    format!("After this revision every sentence in the part called {id} stays short and clear.")
}

/// The text of the `<section ...>` quoted after `label`.
fn block_after(prompt: &str, label: &str) -> Option<String> {
    let start = prompt.find(label)?;
    let rest = &prompt[start..];
    let tag = rest.find("<section")?;
    let open = tag + rest[tag..].find(">\n")? + 2;
    let close = rest[open..].find("\n</section>")?;
    Some(rest[open..open + close].to_string())
}

fn prompt_of(r: &RecordedRequest) -> String {
    r.messages().into_iter().map(|(_, c)| c).collect::<Vec<_>>().join("\n")
}

/// What a call is, for the token table.
fn kind(r: &RecordedRequest) -> &'static str {
    if r.is_embeddings() {
        return "embeddings";
    }
    if prompt_of(r).starts_with("You are checking one section of a document after the section before it") {
        return "consistency";
    }
    let schema = r.body.pointer("/response_format/json_schema/name").and_then(Value::as_str);
    match schema {
        Some("section_verdict") => "judge",
        Some("section_instruction") => "arbiter",
        _ => {
            let p = prompt_of(r);
            if p.contains("Fix one section of a document surgically") {
                "patcher"
            } else if p.contains("Rewrite one section of a document from scratch") {
                "expander"
            } else {
                "delta_judge"
            }
        }
    }
}

fn handler(
    targets: &'static [&'static str],
    structure: bool,
    sections: Vec<pb::Section>,
) -> impl Fn(&RecordedRequest) -> Reply + Send + Sync {
    move |r: &RecordedRequest| {
        if r.is_embeddings() {
            return Reply::embeddings(r.embedding_inputs().iter().map(|t| hash_embedding(t, 32)).collect());
        }
        let prompt = prompt_of(r);
        let reply = match kind(r) {
            "judge" => {
                let open: Vec<&str> = targets.iter().copied().filter(|id| !prompt.contains(&marker(id))).collect();
                let low = if open.is_empty() { 0.9 } else { 0.6 };
                let issues: Vec<Value> = open
                    .iter()
                    .map(|id| {
                        json!({"section_id": id, "criterion": "clarity_readability", "severity": "major",
                               "description": format!("Section {id} is hard to follow"),
                               "fix_instruction": format!("Shorten the sentences of {id}"), "location": ""})
                    })
                    .collect();
                let structure_score = if structure && !open.is_empty() { 0.5 } else { low };
                Reply::json(json!({
                    "criterion_scores": {"factual_accuracy": 0.9, "learning_objective_alignment": low,
                        "pedagogical_structure": structure_score, "clarity_readability": low,
                        "engagement_examples": low, "completeness": 0.9},
                    "issues": issues, "section_scores": []
                }))
            }
            "arbiter" => Reply::json(json!({"instruction": "Shorten the long sentences; keep every fact."})),
            "patcher" | "expander" => {
                let label = if kind(r) == "patcher" { "The section to fix" } else { "The current section" };
                let current = block_after(&prompt, label).unwrap_or_default();
                let id = sections
                    .iter()
                    .find(|s| current.starts_with(s.content.get(..40).unwrap_or(&s.content)))
                    .map_or("unknown", |s| s.id.as_str());
                Reply::text(format!("<section>{current} {}</section>", marker(id)))
            }
            _ => Reply::with_logprobs("YES", vec![("YES", -0.01), ("NO", -5.0)]),
        };
        reply.usage((prompt.len() / 4) as u64, REPLY_TOKENS)
    }
}

/// Replies are short next to prompts: a flat 60 tokens a reply.
const REPLY_TOKENS: u64 = 60;

struct RunFigures {
    events: Vec<gw::RunEvent>,
    wall: Duration,
    tokens_by_kind: BTreeMap<&'static str, u64>,
    /// Tokens of the first assessment: every call before the first edit.
    assessment: u64,
    /// Tokens of the full judging that confirms a focused judging's decision (and its plan).
    confirmation: u64,
    result: gw::TargetedRefinementResult,
}

async fn refine(targets: &'static [&'static str], structure: bool, parallel: u32, latency: Duration) -> RunFigures {
    let sandbox = MeshSandbox::start().await;
    let (sections, brief) = lesson();
    let h = handler(targets, structure, sections.clone());
    let seen: Arc<Mutex<Vec<RecordedRequest>>> = Arc::default();
    let log = seen.clone();
    sandbox.llm.set_handler(move |r| {
        if let Ok(mut l) = log.lock() {
            l.push(r.clone());
        }
        h(r).delay(latency)
    });
    let pipeline = gw::TargetedRefinementPipeline {
        sections,
        brief: Some(brief),
        mode: gw::RefinementMode::FullAuto as i32,
        max_parallel_patchers: Some(parallel),
        token_budget: Some(1_000_000),
        ..Default::default()
    };
    let started = Instant::now();
    let debug = std::env::var_os("DEBUG").is_some();
    let events =
        run_to_end(sandbox.gateway().await, gw::run_pipeline_request::Pipeline::TargetedRefinement(pipeline)).await;
    let wall = started.elapsed();
    if debug {
        for e in &events {
            println!("{:?}", e.event);
        }
    }
    let result = events
        .iter()
        .find_map(|e| match &e.event {
            Some(gw::run_event::Event::Completed(c)) => match c.result.as_ref().and_then(|r| r.result.clone()) {
                Some(gw::run_result::Result::TargetedRefinement(t)) => Some(t),
                _ => None,
            },
            _ => None,
        })
        .expect("the run completes with a refinement result");
    let mut tokens_by_kind: BTreeMap<&'static str, u64> = BTreeMap::new();
    let calls = seen.lock().map(|l| l.clone()).unwrap_or_default();
    let (mut assessment, mut confirmation) = (0u64, 0u64);
    let (mut edited, mut focused, mut confirming) = (false, false, false);
    for r in &calls {
        if debug {
            println!("{} {:?}", kind(r), prompt_of(r).chars().take(120).collect::<String>());
        }
        if r.is_embeddings() {
            continue;
        }
        let k = kind(r);
        let t = (prompt_of(r).len() / 4) as u64 + REPLY_TOKENS;
        *tokens_by_kind.entry(k).or_default() += t;
        edited |= matches!(k, "patcher" | "expander");
        if k == "judge" {
            let part = prompt_of(r).contains("You see PART of a longer document");
            focused |= part;
            confirming = edited && focused && !part;
        }
        if !edited {
            assessment += t;
        } else if confirming && matches!(k, "judge" | "arbiter") {
            confirmation += t;
        }
    }
    RunFigures { events, wall, tokens_by_kind, assessment, confirmation, result }
}

/// Tokens of the refinement iteration (edits, verification, re-judging, planning): everything
/// but the first assessment and the full judging that confirms a focused judging's decision.
fn iteration_tokens(f: &RunFigures) -> u64 {
    let total: u64 = f.tokens_by_kind.values().sum();
    total - f.assessment - f.confirmation
}

fn edits(f: &RunFigures) -> u64 {
    ["patcher", "expander", "delta_judge", "consistency"]
        .iter()
        .map(|k| f.tokens_by_kind.get(k).copied().unwrap_or(0))
        .sum()
}

fn compare(name: &str, targeted: &RunFigures, full: &RunFigures) {
    assert!(!targeted.result.full_regenerate && full.result.full_regenerate, "scenarios as designed");
    println!("\n{name}: tokens by call kind (characters / 4)");
    println!("{:<14} {:>10} {:>16}", "call kind", "targeted", "full_regenerate");
    for k in ["judge", "arbiter", "patcher", "expander", "delta_judge", "consistency"] {
        println!(
            "{k:<14} {:>10} {:>16}",
            targeted.tokens_by_kind.get(k).copied().unwrap_or(0),
            full.tokens_by_kind.get(k).copied().unwrap_or(0)
        );
    }
    let (t_it, f_it) = (iteration_tokens(targeted), iteration_tokens(full));
    println!(
        "iteration (edits + verification + re-judge + plan): targeted {t_it}, full regenerate {f_it}: {:.0}%",
        100.0 * t_it as f64 / f_it as f64
    );
    println!(
        "first assessment (apart from the budget): targeted {}, full regenerate {}; confirming full judging: targeted {}, full regenerate {}",
        targeted.assessment, full.assessment, targeted.confirmation, full.confirmation
    );
    println!(
        "edits alone (refiner + delta judge): targeted {}, full regenerate {}: {:.0}%",
        edits(targeted),
        edits(full),
        100.0 * edits(targeted) as f64 / edits(full) as f64
    );
    println!(
        "outcomes: targeted {:?} {:.2}, changed {:?}; full regenerate {:?} {:.2}, changed {:?}",
        gw::RefinementOutcome::try_from(targeted.result.outcome).unwrap_or_default(),
        targeted.result.final_score,
        targeted.result.changed_section_ids,
        gw::RefinementOutcome::try_from(full.result.outcome).unwrap_or_default(),
        full.result.final_score,
        full.result.changed_section_ids
    );
}

#[tokio::main]
async fn main() {
    println!("targeted refinement, 5-section lesson (examples/lesson.json), scripted backend");
    for (name, targets) in [("one section with a problem", ONE), ("three non-adjacent sections with a problem", THREE)]
    {
        let targeted = refine(targets, false, 3, Duration::ZERO).await;
        let full = refine(targets, true, 3, Duration::ZERO).await;
        compare(name, &targeted, &full);
    }
    let latency = Duration::from_millis(50);
    let parallel = refine(THREE, false, 3, latency).await;
    let serial = refine(THREE, false, 1, latency).await;
    println!(
        "\nwall time at 50 ms a call, three patches: one parallel batch {:.0} ms, one task at a time {:.0} ms ({:.2}x); events {} / {}",
        parallel.wall.as_secs_f64() * 1e3,
        serial.wall.as_secs_f64() * 1e3,
        serial.wall.as_secs_f64() / parallel.wall.as_secs_f64(),
        parallel.events.len(),
        serial.events.len()
    );
}
