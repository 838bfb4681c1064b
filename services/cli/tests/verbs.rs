//! The `assay` verbs that start and follow a pipeline run (`debate`, `refine-text`) end to end: the
//! real binary, its own in-process mesh, and a scripted OpenAI-compatible backend (a real HTTP
//! server on loopback) that answers every call from what the request says.
#![allow(clippy::wildcard_enum_match_arm)]

use std::path::{Path, PathBuf};

use assay_testkit::{RecordedRequest, Reply, ScriptedLlm, hash_embedding};
use serde_json::{Value, json};

mod common;
use common::{assay_async as assay, config_file, lines, stderr};

/// The first user message of a chat call.
fn prompt(r: &RecordedRequest) -> String {
    r.first_user_message()
}

/// Whether the call is a self-refine critique/revise call (its prompt starts with the task).
fn is_self_refine(r: &RecordedRequest) -> bool {
    r.is_chat() && prompt(r).starts_with("TASK:")
}

/// Embedding calls get deterministic vectors.
fn embeddings(r: &RecordedRequest) -> Reply {
    Reply::embeddings(r.embedding_inputs().iter().map(|t| hash_embedding(t, 32)).collect())
}

// --- assay debate ---------------------------------------------------------------------------------

/// A scripted problem: what the three solvers answer first and after refinement. The judge always
/// picks solver_1.
struct Scripted {
    id: &'static str,
    problem: &'static str,
    reference: &'static str,
    original: [&'static str; 3],
    refined: [&'static str; 3],
}

/// 17 * 23: solver_3 corrects itself; right. 2 + 2: solver_1 keeps a wrong answer; wrong. Capital
/// of France: right from the start.
const SET: [Scripted; 3] = [
    Scripted {
        id: "mul",
        problem: "What is 17 * 23?",
        reference: "391",
        original: ["391", "391", "390"],
        refined: ["391", "391", "391"],
    },
    Scripted {
        id: "add",
        problem: "What is 2 + 2?",
        reference: "4",
        original: ["5", "5", "4"],
        refined: ["5", "5", "4"],
    },
    Scripted {
        id: "capital",
        problem: "What is the capital of France?",
        reference: "Paris",
        original: ["Paris", "paris", "Paris."],
        refined: ["Paris", "Paris", "Paris"],
    },
];

fn write_problems(dir: &Path) -> PathBuf {
    let path = dir.join("problems.jsonl");
    let text: String = SET
        .iter()
        .map(|s| format!("{}\n", json!({"id": s.id, "problem": s.problem, "reference": s.reference})))
        .collect();
    std::fs::write(&path, text).unwrap();
    path
}

fn solver_index(id: &str) -> usize {
    ["solver_1", "solver_2", "solver_3"].iter().position(|i| *i == id).unwrap_or_else(|| panic!("solver {id}"))
}

fn problem_of(r: &RecordedRequest) -> &'static Scripted {
    let p = prompt(r);
    SET.iter().find(|s| p.contains(s.problem)).unwrap_or_else(|| panic!("no known problem in {p}"))
}

/// The debate's calls, by stage; self-refine calls revise the draft to "<draft>, ok".
fn debate_answer(r: &RecordedRequest) -> Reply {
    if r.is_embeddings() {
        return embeddings(r);
    }
    if is_self_refine(r) {
        let p = prompt(r);
        let draft = p.split("DRAFT:\n<draft>\n").nth(1).and_then(|d| d.split("\n</draft>").next()).unwrap_or("");
        return Reply::text(format!("<critique>\n- Say it plainly.\n</critique>\n<revised>\n{draft}, ok\n</revised>"));
    }
    let s = problem_of(r);
    let who = r.debate_speaker();
    let reply = match r.schema_name() {
        "debate_solution" => json!({"approach": "direct", "reasoning_steps": [format!("step of {who}")],
                                    "final_answer": s.original[solver_index(&who)], "confidence": 0.7}),
        "debate_review" => json!({"strengths": ["clear"], "weaknesses": [], "errors": [],
                                  "suggested_changes": ["double-check"]}),
        "debate_refinement" => {
            let i = solver_index(&who);
            json!({"critiques_accepted": ["double-check"], "critiques_rejected": [],
                   "refinement_reasoning": "checked again", "reasoning_steps": ["checked"],
                   "final_answer": s.refined[i], "confidence": 0.8,
                   "changed_from_original": s.refined[i] != s.original[i], "improvement_explanation": "checked"})
        }
        "debate_judgment" => json!({"reasoning": "solver_1 is careful", "winner": "solver_1", "confidence": 0.9}),
        other => panic!("unexpected stage {other}"),
    };
    Reply::json(reply).usage(50, 10)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debate_writes_one_line_per_problem_and_prints_the_accuracy() {
    let backend = ScriptedLlm::start().await;
    backend.set_handler(debate_answer);
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), &backend, ":memory:");
    let data = write_problems(dir.path());
    let out = dir.path().join("out.jsonl");
    let o = assay(&config, &["debate", "--data", data.to_str().unwrap(), "--out", out.to_str().unwrap()]).await;
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "stderr: {err}");
    let results = lines(&out);
    let got: Vec<(&str, &str, Option<bool>)> = results
        .iter()
        .map(|r| (r["id"].as_str().unwrap(), r["finalAnswer"].as_str().unwrap(), r["correct"].as_bool()))
        .collect();
    // One line per problem in input order, the judge's pick (solver_1's refined answer), graded.
    assert_eq!(got, [("mul", "391", Some(true)), ("add", "5", Some(false)), ("capital", "Paris", Some(true))]);
    for r in &results {
        assert_eq!(r["decidedBy"], "DEBATE_DECISION_JUDGE", "{r}");
        assert_eq!(r["debate"]["winnerSolverId"], "solver_1", "{r}");
        assert!(r.get("selfRefined").is_none(), "no hook unless asked: {r}");
    }
    // A progress line per problem, then the summary with the accuracy against the references.
    assert!(err.contains("mul: \"391\" (correct, judge,"), "{err}");
    assert!(err.contains("add: \"5\" (wrong, judge,"), "{err}");
    assert!(err.contains("3 problems, 0 failed"), "{err}");
    assert!(err.contains("debate accuracy      66.7% (2/3)"), "{err}");
    // No self-refine call without the hook.
    assert!(!backend.requests().iter().any(is_self_refine));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debate_refuses_a_problem_file_naming_the_bad_line() {
    let backend = ScriptedLlm::start().await;
    backend.set_handler(debate_answer);
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), &backend, ":memory:");
    let data = dir.path().join("problems.jsonl");
    std::fs::write(&data, "{\"id\": \"a\", \"problem\": \"What is 2 + 2?\"}\n{\"id\": \"b\", \"reference\": \"4\"}\n")
        .unwrap();
    let out = dir.path().join("out.jsonl");
    let o = assay(&config, &["debate", "--data", data.to_str().unwrap(), "--out", out.to_str().unwrap()]).await;
    let err = stderr(&o);
    // Bad input: exit 2 (see `assay debate --help`), before any mesh or model call.
    assert_eq!(o.status.code(), Some(2), "stderr: {err}");
    assert!(err.contains("problems.jsonl:2: field \"problem\" is required"), "{err}");
    assert!(!out.exists(), "nothing written");
    assert_eq!(backend.request_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debate_with_self_refine_puts_the_hook_entry_in_each_line() {
    let backend = ScriptedLlm::start().await;
    backend.set_handler(debate_answer);
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), &backend, ":memory:");
    let data = write_problems(dir.path());
    let out = dir.path().join("out.jsonl");
    let o = assay(
        &config,
        &[
            "debate",
            "--data",
            data.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--self-refine",
            "--self-refine-min-bytes",
            "0",
            "--self-refine-exclude",
            "add",
        ],
    )
    .await;
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "stderr: {err}");
    let results = lines(&out);
    assert_eq!(results.len(), 3);
    for (r, s) in results.iter().zip(&SET) {
        let hook = &r["selfRefined"];
        assert_eq!((hook["target"].as_str(), hook["producer"].as_str()), (Some(s.id), Some("debate")), "{r}");
        let debated = s.refined[0];
        assert_eq!(hook["before"], debated, "{r}");
        if s.id == "add" {
            // Excluded: kept as the debate answered, no model call.
            assert_eq!(hook["skipped"], "excluded", "{r}");
            assert_eq!(r["finalAnswer"], debated, "{r}");
            assert!(err.contains("self-refine add (debate): skipped: excluded"), "{err}");
        } else {
            // The final answer is the hook's output; grading keeps the debate's answer.
            let after = format!("{debated}, ok");
            assert_eq!(hook["after"].as_str(), Some(after.as_str()), "{r}");
            assert_ne!(hook["after"], hook["before"], "changed: {r}");
            assert_eq!(r["finalAnswer"], after.as_str(), "{r}");
            assert_eq!(r["correct"], true, "{r}");
            assert_eq!(hook["refine"]["passes"].as_array().map(Vec::len), Some(1), "{r}");
            assert_eq!(hook["refine"]["passes"][0]["critique"], json!(["Say it plainly."]), "{r}");
            assert!(err.contains(&format!("self-refine {} (debate): ", s.id)), "{err}");
        }
    }
    assert!(err.contains("after 1 pass, text changed"), "{err}");
    assert!(err.contains("debate accuracy      66.7% (2/3)"), "{err}");
    let polished: Vec<String> = backend.requests().iter().filter(|r| is_self_refine(r)).map(prompt).collect();
    assert_eq!(polished.len(), 2, "one self-refine call per answer not excluded");
    assert!(polished.iter().any(|p| p.contains("What is 17 * 23?")), "the problem is the instruction");
}

// --- assay refine-text ----------------------------------------------------------------------------

const DRAFT: &str = "Photosynthesis is how plants make food. They use light. Water and carbon dioxide go in and \
                     sugar and oxygen come out. This happens in the leaves of the plant, inside small parts of the \
                     cells that hold a green pigment.\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refine_text_prints_the_revised_text() {
    let backend = ScriptedLlm::start().await;
    backend.set_handler(|r| {
        if r.is_embeddings() {
            embeddings(r)
        } else if is_self_refine(r) {
            Reply::text(format!("<critique>\n- x\n</critique>\n<revised>\n{} NEW TEXT\n</revised>", DRAFT.trim()))
        } else {
            panic!("unexpected call: {}", r.raw_body)
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), &backend, ":memory:");
    let input = dir.path().join("draft.txt");
    std::fs::write(&input, DRAFT).unwrap();
    let o = assay(
        &config,
        &["refine-text", "--input", input.to_str().unwrap(), "--instruction", "Explain photosynthesis to a child."],
    )
    .await;
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "stderr: {err}");
    // Only the text on standard output, so it can be piped.
    assert_eq!(String::from_utf8_lossy(&o.stdout), format!("{} NEW TEXT\n", DRAFT.trim()));
    assert!(err.contains(&format!("self-refine of a {}-byte draft, at most 1 pass", DRAFT.len())), "{err}");
    assert!(err.contains("pass 1: 1 critique point;"), "{err}");
    assert!(err.contains("after 1 pass, text changed"), "{err}");
    // One critique/revise call: the instruction as the task, the draft as given.
    let calls: Vec<String> = backend.requests().iter().filter(|r| is_self_refine(r)).map(prompt).collect();
    assert_eq!(calls.len(), 1);
    assert!(
        calls[0].starts_with("TASK:\n<instruction>\nExplain photosynthesis to a child.\n</instruction>"),
        "{}",
        calls[0]
    );
    assert!(calls[0].contains("Photosynthesis is how plants make food."), "{}", calls[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refine_text_json_is_the_response_in_the_proto_mapping() {
    let backend = ScriptedLlm::start().await;
    backend.set_handler(|r| {
        if r.is_embeddings() {
            embeddings(r)
        } else {
            Reply::text(format!("<critique>\n- x\n</critique>\n<revised>\n{} NEW TEXT\n</revised>", DRAFT.trim()))
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), &backend, ":memory:");
    let input = dir.path().join("draft.txt");
    std::fs::write(&input, DRAFT).unwrap();
    let o = assay(&config, &["refine-text", "--input", input.to_str().unwrap(), "--json"]).await;
    assert_eq!(o.status.code(), Some(0), "stderr: {}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    // The SelfRefineResponse in the proto3 JSON mapping, with the run's id and state.
    assert_eq!(v["finalText"], format!("{} NEW TEXT", DRAFT.trim()), "{v}");
    assert_eq!(v["state"], "RUN_STATE_SUCCEEDED", "{v}");
    assert!(v["runId"].as_str().is_some_and(|id| !id.is_empty()), "{v}");
    assert_eq!(v["passes"].as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(v["passes"][0]["critique"], json!(["x"]), "{v}");
    assert!(v["stopReason"].as_str().is_some_and(|r| r.starts_with("SELF_REFINE_STOP_REASON_")), "{v}");
}

// --- against a running gateway: runs show / watch -------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_show_and_watch_render_the_self_refine_entries_of_a_debate() {
    let backend = ScriptedLlm::start().await;
    backend.set_handler(debate_answer);
    let dir = tempfile::tempdir().unwrap();
    let config_path = config_file(dir.path(), &backend, ":memory:");
    let mut config = assay_config::load(Some(&config_path)).unwrap();
    config.ports = assay_config::Ports::ephemeral();
    let (hub, loading) = assay_runtime::build_hub(&config, &[]).unwrap();
    loading.await.unwrap();
    let mesh = assay_cli::start_mesh(&config, std::sync::Arc::new(hub), true).await.unwrap();
    let gateway = format!("http://{}", mesh.addrs.gateway);
    let data = dir.path().join("one.jsonl");
    std::fs::write(&data, format!("{}\n", json!({"id": "mul", "problem": SET[0].problem, "reference": "391"})))
        .unwrap();

    let o = assay(
        &config_path,
        &["debate", "--data", data.to_str().unwrap(), "--gateway", &gateway, "--self-refine-min-bytes", "0"],
    )
    .await;
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "stderr: {err}");
    let line: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(line["finalAnswer"], "391, ok", "--self-refine-min-bytes implies --self-refine");
    let run_id = err
        .lines()
        .find_map(|l| l.strip_prefix("run ").and_then(|l| l.strip_suffix(" started: 1 problems")))
        .unwrap_or_else(|| panic!("the run id in {err}"))
        .to_string();

    let o = assay(&config_path, &["runs", "show", &run_id, "--gateway", &gateway, "--json"]).await;
    assert_eq!(o.status.code(), Some(0), "stderr: {}", stderr(&o));
    let shown: Value = serde_json::from_slice(&o.stdout).unwrap();
    let problems = shown["result"]["debate"]["problems"].as_array().unwrap_or_else(|| panic!("{shown}"));
    let entries: Vec<&Value> = problems.iter().filter_map(|p| p.get("selfRefined")).collect();
    assert_eq!(entries.len(), 1);
    assert_eq!((entries[0]["target"].as_str(), entries[0]["after"].as_str()), (Some("mul"), Some("391, ok")));

    let o = assay(&config_path, &["runs", "watch", &run_id, "--gateway", &gateway]).await;
    assert_eq!(o.status.code(), Some(0), "stderr: {}", stderr(&o));
    let watched = String::from_utf8_lossy(&o.stdout);
    assert!(
        watched.lines().any(|l| l.contains(" self-refine mul (debate): ") && l.ends_with("text changed")),
        "{watched}"
    );
    mesh.shutdown().await.unwrap();
}
