//! What transient backend faults cost the sequential pipelines (issue 29): targeted refinement,
//! debate and self-refine through the whole mesh (a fresh [`MeshSandbox`] per run, so every call
//! class starts cold, as in a fresh `assay` process) against the scripted backend answering every
//! call after `FAULT_LATENCY_MS` (default 50), once without faults and once with 20% of attempts
//! answered 429 (no `Retry-After`), 10% a 5xx (500, 502 or 503, in turn) and 5% never answered.
//! Prints one table: pipeline, fault-free time, faulted time, ratio, run outcome (the median of
//! `FAULT_REPEATS` runs, default 3, and the slowest). `FAULT_FLOOR_MS` sets the adaptive timeout
//! floor of the sandbox's backend client (default: the client's default, 1 s); `FAULT_HEDGE` its
//! `hedge_factor` (default: the client's default, 2; 0 hedges only the last attempt). Run:
//!
//! `cargo test -p assay-tests --test fault_costs -- --ignored --nocapture`
//!
//! `FAULT_FIXED_LIMIT=N` fixes the client's concurrency limit at N (default: adaptive).
//! `FAULT_ONLY=debate` runs one pipeline; `FAULT_SEED` (default 29) seeds the faults; `RUST_LOG`
//! turns on logs.
//!
//! Timing figures belong here, not in assertions: the test asserts only that every run completes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use assay_proto::common::v1 as pb;
use assay_proto::gateway::v1 as gw;
use assay_proto::refiners::v1 as rf;
use assay_testkit::{FaultCounts, FaultMix, RecordedRequest, Reply, hash_embedding, with_faults};
use assay_tests::{MeshSandbox, SandboxOptions, run_to_end};
use serde_json::{Value, json};

type Handler = Arc<dyn Fn(&RecordedRequest) -> Reply + Send + Sync>;
/// A pipeline request and the scripted backend's answers for it.
type Scenario = fn() -> (gw::run_pipeline_request::Pipeline, Handler);

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The injected faults, per attempt.
const ISSUE_29: FaultMix = FaultMix { rate_limited: 0.20, server_error: 0.10, unanswered: 0.05 };

/// What was injected in one run: the testkit's counts, and the unanswered attempts (when, since
/// the first attempt; path, token limit, schema).
#[derive(Default)]
struct Injected {
    counts: Arc<FaultCounts>,
    hung: Mutex<Vec<String>>,
    first: Mutex<Option<Instant>>,
}

/// `base` after `latency`, with `faults` injected on chat and embedding attempts alike
/// ([`assay_testkit::with_faults`]); each unanswered attempt is noted.
fn faulty(base: Handler, faults: Option<FaultMix>, seed: u64, latency: Duration, injected: Arc<Injected>) -> Handler {
    let answers = move |r: &RecordedRequest| base(r).delay(latency);
    let inner = with_faults(answers, faults.unwrap_or_default(), seed, injected.counts.clone());
    Arc::new(move |r| {
        let first = *injected.first.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(Instant::now);
        let reply = inner(r);
        if reply.is_hang() {
            let limit = r.body.get("max_tokens").and_then(Value::as_u64);
            injected.hung.lock().unwrap_or_else(|p| p.into_inner()).push(format!(
                "at {:.2} s {} max_tokens {limit:?} {:?}",
                first.elapsed().as_secs_f64(),
                r.path,
                schema_name(r)
            ));
        }
        reply
    })
}

fn prompt_of(r: &RecordedRequest) -> String {
    r.messages().into_iter().map(|(_, c)| c).collect::<Vec<_>>().join("\n")
}

fn schema_name(r: &RecordedRequest) -> Option<String> {
    r.body.pointer("/response_format/json_schema/name").and_then(Value::as_str).map(String::from)
}

fn embeddings(r: &RecordedRequest) -> Reply {
    Reply::embeddings(r.embedding_inputs().iter().map(|t| hash_embedding(t, 32)).collect())
}

// --- targeted refinement: the lesson, three non-adjacent sections with a clarity problem ---------

const TARGETS: &[&str] = &["intro", "example", "summary"];

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

/// The section a patcher or expander prompt asks about: the one whose opening it quotes last
/// (the section under repair comes after the document context).
fn section_asked_about<'a>(prompt: &str, sections: &'a [pb::Section]) -> Option<&'a pb::Section> {
    sections
        .iter()
        .filter_map(|s| prompt.rfind(s.content.get(..40).unwrap_or(&s.content)).map(|at| (at, s)))
        .max_by_key(|(at, _)| *at)
        .map(|(_, s)| s)
}

fn refinement_handler(sections: Vec<pb::Section>) -> Handler {
    Arc::new(move |r| {
        if r.is_embeddings() {
            return embeddings(r);
        }
        let prompt = prompt_of(r);
        let logprobs = r.body.get("logprobs").and_then(Value::as_bool) == Some(true);
        match schema_name(r).as_deref() {
            Some("section_verdict") => {
                let open: Vec<&str> = TARGETS.iter().copied().filter(|id| !prompt.contains(&marker(id))).collect();
                let low = if open.is_empty() { 0.9 } else { 0.6 };
                let issues: Vec<Value> = open
                    .iter()
                    .map(|id| {
                        json!({"section_id": id, "criterion": "clarity_readability", "severity": "major",
                               "description": format!("Section {id} is hard to follow"),
                               "fix_instruction": format!("Shorten the sentences of {id}"), "location": ""})
                    })
                    .collect();
                Reply::json(json!({
                    "criterion_scores": {"factual_accuracy": 0.9, "learning_objective_alignment": low,
                        "pedagogical_structure": low, "clarity_readability": low,
                        "engagement_examples": low, "completeness": 0.9},
                    "issues": issues, "section_scores": []
                }))
            }
            Some("section_instruction") => {
                Reply::json(json!({"instruction": "Shorten the long sentences; keep every fact."}))
            }
            Some(_) => assay_testkit::schema_reply(r),
            None if logprobs => Reply::with_logprobs("YES", vec![("YES", -0.01), ("NO", -5.0)]),
            None => match section_asked_about(&prompt, &sections) {
                Some(s) => Reply::text(format!("<section>{} {}</section>", s.content, marker(&s.id))),
                None => Reply::text("YES"),
            },
        }
        .usage((prompt.len() / 4) as u64, 60)
    })
}

fn targeted_refinement() -> (gw::run_pipeline_request::Pipeline, Handler) {
    let (sections, brief) = lesson();
    let pipeline = gw::TargetedRefinementPipeline {
        sections: sections.clone(),
        brief: Some(brief),
        mode: gw::RefinementMode::FullAuto as i32,
        max_parallel_patchers: Some(3),
        token_budget: Some(1_000_000),
        ..Default::default()
    };
    (gw::run_pipeline_request::Pipeline::TargetedRefinement(pipeline), refinement_handler(sections))
}

// --- debate: five problems, one round, the solvers agree with the reference ----------------------

const DEBATE_PROBLEMS: usize = 5;

fn debate() -> (gw::run_pipeline_request::Pipeline, Handler) {
    let problems: Vec<gw::DebateProblem> = include_str!("../../examples/problems.jsonl")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .take(DEBATE_PROBLEMS)
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("problem line parses");
            gw::DebateProblem {
                id: v["id"].as_str().unwrap_or_default().into(),
                problem: v["problem"].as_str().unwrap_or_default().into(),
                reference: v["reference"].as_str().map(String::from),
            }
        })
        .collect();
    let answers: HashMap<String, String> =
        problems.iter().map(|p| (p.problem.clone(), p.reference.clone().unwrap_or_default())).collect();
    let handler: Handler = Arc::new(move |r| {
        let prompt = prompt_of(r);
        let answer = answers.iter().find(|(q, _)| prompt.contains(q.as_str())).map_or("0", |(_, a)| a.as_str());
        let reply = match schema_name(r).as_deref() {
            Some("debate_solution") => json!({"approach": "direct", "reasoning_steps": ["work it out"],
                                             "final_answer": answer, "confidence": 0.7}),
            Some("debate_review") => {
                json!({"strengths": ["clear"], "weaknesses": [], "errors": [], "suggested_changes": ["check"]})
            }
            Some("debate_refinement") => json!({"critiques_accepted": ["check"], "critiques_rejected": [],
                   "refinement_reasoning": "checked", "reasoning_steps": ["checked"], "final_answer": answer,
                   "confidence": 0.8, "changed_from_original": false, "improvement_explanation": "checked"}),
            _ => json!({"reasoning": "solver_1 is right", "winner": "solver_1", "confidence": 0.9}),
        };
        Reply::json(reply).usage(50, 10)
    });
    let pipeline = gw::DebatePipeline { problems, ..Default::default() };
    (gw::run_pipeline_request::Pipeline::Debate(pipeline), handler)
}

// --- self-refine: one draft, three passes ---------------------------------------------------------

fn self_refine() -> (gw::run_pipeline_request::Pipeline, Handler) {
    let draft = "Photosynthesis is how plants make food. They use light. Water and carbon dioxide go in and \
                 sugar and oxygen come out. This happens in the leaves of the plant, inside small parts of \
                 the cells that hold a green pigment.";
    let pass = Arc::new(Mutex::new(HashMap::<String, usize>::new()));
    let handler: Handler = Arc::new(move |r| {
        if r.is_embeddings() {
            return embeddings(r);
        }
        // The same revision for the same prompt, whichever attempt it is.
        let key = prompt_of(r);
        let n = {
            let mut seen = pass.lock().unwrap_or_else(|p| p.into_inner());
            let next = seen.len() + 1;
            *seen.entry(key).or_insert(next)
        };
        Reply::text(format!(
            "<critique>\n- Name the cell parts.\n</critique>\n<revised>\nPhotosynthesis is how plants make \
             their food from light. Water and carbon dioxide go in; sugar and oxygen come out. It happens in \
             the chloroplasts of leaf cells, which hold the green pigment chlorophyll. Revision {n} names the \
             parts plainly.\n</revised>"
        ))
    });
    let pipeline = gw::SelfRefinePipeline {
        request: Some(rf::SelfRefineRequest {
            draft: draft.into(),
            instruction: "Explain photosynthesis to a ten-year-old.".into(),
            max_passes: Some(3),
            ..Default::default()
        }),
    };
    (gw::run_pipeline_request::Pipeline::SelfRefine(pipeline), handler)
}

// --- runs --------------------------------------------------------------------------------------

struct Run {
    wall: Duration,
    outcome: String,
    injected: String,
}

fn outcome(events: &[gw::RunEvent]) -> String {
    let Some(gw::run_event::Event::Completed(done)) = events.last().and_then(|e| e.event.clone()) else {
        return "no completion".into();
    };
    let state = gw::RunState::try_from(done.state).map_or_else(|_| "?".into(), |s| format!("{s:?}"));
    let detail = match done.result.and_then(|r| r.result) {
        Some(gw::run_result::Result::TargetedRefinement(t)) => {
            format!("{:?} {:.2}", gw::RefinementOutcome::try_from(t.outcome).unwrap_or_default(), t.final_score)
        }
        Some(gw::run_result::Result::Debate(d)) => {
            format!("{}/{} failed", d.problems_failed, d.problems_total)
        }
        Some(gw::run_result::Result::SelfRefine(s)) => format!("{} passes", s.passes.len()),
        Some(_) | None => String::new(),
    };
    format!("{state} {detail}")
}

async fn run_once(make: Scenario, faults: Option<FaultMix>, seed: u64) -> Run {
    let latency = Duration::from_millis(env_u64("FAULT_LATENCY_MS", 50));
    let mut options = SandboxOptions::default();
    let floor = std::env::var("FAULT_FLOOR_MS").ok().and_then(|v| v.parse().ok());
    let hedge = std::env::var("FAULT_HEDGE").ok().and_then(|v| v.parse::<f64>().ok());
    // The client's defaults (the sandbox turns hedging off for tests that count calls).
    let default = assay_llm::AdaptiveTimeout::default();
    options.adaptive_timeout = Some(assay_llm::AdaptiveTimeout {
        floor: floor.map_or(default.floor, Duration::from_millis),
        hedge_factor: hedge.unwrap_or(default.hedge_factor),
        ..default
    });
    options.fixed_concurrency = std::env::var("FAULT_FIXED_LIMIT").ok().and_then(|v| v.parse().ok());
    let sandbox = MeshSandbox::start_with(options).await;
    let (pipeline, base) = make();
    let injected = Arc::new(Injected::default());
    let handler = faulty(base, faults, seed, latency, injected.clone());
    sandbox.llm.set_handler(move |r| handler(r));
    let started = Instant::now();
    let events = run_to_end(sandbox.gateway().await, pipeline).await;
    let wall = started.elapsed();
    let load = |n: &AtomicUsize| n.load(Ordering::SeqCst);
    let injected_counts = format!(
        "{} attempts: {} 429, {} 5xx, {} unanswered",
        load(&injected.counts.attempts),
        load(&injected.counts.rate_limited),
        load(&injected.counts.server_error),
        load(&injected.counts.unanswered)
    );
    let hung = injected.hung.lock().unwrap_or_else(|p| p.into_inner()).join("; ");
    let injected = if faults.is_some() { format!("{injected_counts}; unanswered: {hung}") } else { injected_counts };
    let _ = sandbox.shutdown().await;
    Run { wall, outcome: outcome(&events), injected }
}

fn median(runs: &mut [Run]) -> &Run {
    runs.sort_by_key(|r| r.wall);
    &runs[runs.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: prints the fault-cost table (see the module docs)"]
async fn fault_costs_of_the_sequential_pipelines() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).try_init();
    }
    let only = std::env::var("FAULT_ONLY").unwrap_or_default();
    let repeats = env_u64("FAULT_REPEATS", 3).max(1);
    let seed = env_u64("FAULT_SEED", 29);
    let pipelines: [(&str, Scenario); 3] =
        [("targeted refinement", targeted_refinement), ("debate", debate), ("self-refine", self_refine)];
    let mut table = Vec::new();
    for (name, make) in pipelines {
        if !name.starts_with(only.as_str()) {
            continue;
        }
        let mut clean = Vec::new();
        let mut faulted = Vec::new();
        for k in 0..repeats {
            clean.push(run_once(make, None, seed + k).await);
            let run = run_once(make, Some(ISSUE_29), seed + k).await;
            println!("{name} run {k}: {:.2} s, {}; {}", run.wall.as_secs_f64(), run.outcome, run.injected);
            faulted.push(run);
        }
        let slowest = faulted.iter().map(|r| r.wall).max().unwrap_or_default();
        let (c, f) = (median(&mut clean), median(&mut faulted));
        assert!(!c.outcome.starts_with("no completion") && !f.outcome.starts_with("no completion"));
        table.push((name, c.wall, c.outcome.clone(), f.wall, f.outcome.clone(), slowest));
    }
    println!(
        "\nfaults per attempt: 20% 429 (no Retry-After), 10% 5xx, 5% unanswered; backend latency {} ms; \
         hedge_factor {}; median of {repeats} runs",
        env_u64("FAULT_LATENCY_MS", 50),
        std::env::var("FAULT_HEDGE").unwrap_or_else(|_| "default".into())
    );
    println!(
        "| {:<19} | {:>12} | {:>10} | {:>6} | {:>12} | {:<28} | {:<28} |",
        "pipeline", "fault-free s", "faulted s", "ratio", "slowest s", "outcome fault-free", "outcome faulted"
    );
    for (name, clean, clean_outcome, faulted, faulted_outcome, slowest) in table {
        println!(
            "| {name:<19} | {:>12.2} | {:>10.2} | {:>5.1}x | {:>12.2} | {clean_outcome:<28} | {faulted_outcome:<28} |",
            clean.as_secs_f64(),
            faulted.as_secs_f64(),
            faulted.as_secs_f64() / clean.as_secs_f64(),
            slowest.as_secs_f64()
        );
    }
}
