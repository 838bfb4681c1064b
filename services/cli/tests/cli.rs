//! The `assay` binary end to end: eval, score, generate and runs, against a scripted
//! OpenAI-compatible backend (a real HTTP server on loopback), with the mesh either started by the
//! command itself or running in this test process.
#![allow(clippy::wildcard_enum_match_arm)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use assay_testkit::{RecordedRequest, Reply, ScriptedLlm, schema_reply};
use serde_json::Value;

mod common;
use common::{assay_with as assay, config_file, lines};

fn write_records(dir: &Path, n: usize, failing: Option<usize>) -> PathBuf {
    let path = dir.join("records.jsonl");
    let text: String = (0..n)
        .map(|i| {
            let target = if Some(i) == failing { "FAIL-ME please".to_string() } else { format!("answer {i}") };
            format!(
                "{}\n",
                serde_json::json!({"id": format!("r{i}"), "input": format!("Write note {i}."), "target": target})
            )
        })
        .collect();
    std::fs::write(&path, text).unwrap();
    path
}

/// Scoring prompts mentioning FAIL-ME get 503 on every attempt (the record fails after the client's
/// retries; a 4xx rejection would fail the whole run); everything else follows the schema.
fn handler(req: &RecordedRequest) -> Reply {
    if req.raw_body.contains("FAIL-ME") { Reply::status(503) } else { schema_reply(req) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_writes_one_line_per_record_and_a_json_summary() {
    let backend = ScriptedLlm::start().await;
    backend.set_handler(handler);
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), &backend, ":memory:");
    let data = write_records(dir.path(), 3, None);
    let out = dir.path().join("out.jsonl");
    let o = tokio::task::spawn_blocking({
        let (config, data, out) = (config.clone(), data.clone(), out.clone());
        move || {
            assay(
                &config,
                &[
                    "eval",
                    "--preset",
                    "tick",
                    "--data",
                    data.to_str().unwrap(),
                    "--out",
                    out.to_str().unwrap(),
                    "--json",
                ],
            )
        }
    })
    .await
    .unwrap();
    assert_eq!(o.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&o.stderr));
    let results = lines(&out);
    assert_eq!(results.len(), 3);
    let mut ids: Vec<&str> = results.iter().map(|r| r["id"].as_str().unwrap()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["r0", "r1", "r2"]);
    for r in &results {
        assert!(r["error"].is_null());
        // The schema-following backend answers YES, NO, YES, ... : a real mix, not a constant.
        let answers = r["answers"].as_object().unwrap();
        assert!(answers.values().any(|a| a == "yes") && answers.values().any(|a| a == "no"), "{r}");
    }
    let summary: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(summary["records"], 3);
    assert_eq!(summary["failed"], 0);
    assert_eq!(summary["state"], "RUN_STATE_SUCCEEDED");
    // 3 generations + 3 batch scorings.
    assert_eq!(summary["usage"]["calls"], 6);
    assert_eq!(backend.request_count(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn score_with_a_checklist_file_exits_3_when_some_records_fail() {
    let backend = ScriptedLlm::start().await;
    backend.set_handler(handler);
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), &backend, ":memory:");
    let data = write_records(dir.path(), 4, Some(2));
    let checklist = dir.path().join("checklist.json");
    std::fs::write(
        &checklist,
        r#"{"id": "c1", "items": ["Is it short?", {"id": "kind", "question": "Is it kind?", "weight": 30}]}"#,
    )
    .unwrap();
    let out = dir.path().join("out.jsonl");
    let o = tokio::task::spawn_blocking({
        let (config, data, out, checklist) = (config.clone(), data.clone(), out.clone(), checklist.clone());
        move || {
            assay(
                &config,
                &[
                    "score",
                    "--checklist",
                    checklist.to_str().unwrap(),
                    "--data",
                    data.to_str().unwrap(),
                    "--out",
                    out.to_str().unwrap(),
                    "--mode",
                    "batch",
                    "--metric",
                    "weighted",
                    "--json",
                ],
            )
        }
    })
    .await
    .unwrap();
    assert_eq!(o.status.code(), Some(3), "stderr: {}", String::from_utf8_lossy(&o.stderr));
    let results = lines(&out);
    assert_eq!(results.len(), 4);
    let failed: Vec<&Value> = results.iter().filter(|r| !r["error"].is_null()).collect();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["id"], "r2");
    for r in results.iter().filter(|r| r["error"].is_null()) {
        assert_eq!(r["checklist_id"], "c1");
        // Batch mode: answers for both items; the weighted score is a real number in [0, 1].
        assert!(r["answers"].as_object().unwrap().contains_key("kind"));
        let w = r["weighted_score"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&w));
    }
    let summary: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(summary["failed"], 1);
    assert_eq!(summary["state"], "RUN_STATE_PARTIAL");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_exits_1_naming_the_problem() {
    let backend = ScriptedLlm::start().await;
    backend.set_handler(handler);
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), &backend, ":memory:");
    let data = dir.path().join("records.jsonl");
    std::fs::write(&data, "{\"input\": \"Write.\", \"target\": \"x\"}\n").unwrap();
    let o = tokio::task::spawn_blocking({
        let (config, data) = (config.clone(), data.clone());
        move || assay(&config, &["eval", "--preset", "rlcf_direct", "--data", data.to_str().unwrap()])
    })
    .await
    .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("INVALID_ARGUMENT") && err.contains("pipeline.records[0].reference"), "{err}");
    assert_eq!(backend.request_count(), 0);
    let o = tokio::task::spawn_blocking({
        let (config, data) = (config.clone(), data.clone());
        move || assay(&config, &["eval", "--preset", "nonsense", "--data", data.to_str().unwrap()])
    })
    .await
    .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown preset \"nonsense\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_and_runs_against_a_running_gateway() {
    let backend = ScriptedLlm::start().await;
    backend.set_handler(handler);
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("runs.db");
    let config_path = config_file(dir.path(), &backend, store.to_str().unwrap());
    let mut config = assay_config::load(Some(&config_path)).unwrap();
    config.ports = assay_config::Ports::ephemeral();
    let (hub, loading) = assay_runtime::build_hub(&config, &[]).unwrap();
    loading.await.unwrap();
    let mesh = assay_cli::start_mesh(&config, Arc::new(hub), true).await.unwrap();
    let gateway = format!("http://{}", mesh.addrs.gateway);

    let o = tokio::task::spawn_blocking({
        let (c, g) = (config_path.clone(), gateway.clone());
        move || {
            assay(
                &c,
                &["generate", "--preset", "tick", "--input", "Write a haiku.", "--max-items", "4", "--gateway", &g],
            )
        }
    })
    .await
    .unwrap();
    assert_eq!(o.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&o.stderr));
    let checklist: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(checklist["source_method"], "tick");
    assert_eq!(checklist["input"], "Write a haiku.");
    // The backend offers 6 questions; --max-items 4 keeps 4.
    assert_eq!(checklist["items"].as_array().unwrap().len(), 4);
    let run_id = checklist["run_id"].as_str().unwrap().to_string();

    let o = tokio::task::spawn_blocking({
        let (c, g) = (config_path.clone(), gateway.clone());
        move || assay(&c, &["runs", "list", "--gateway", &g, "--json"])
    })
    .await
    .unwrap();
    assert_eq!(o.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&o.stderr));
    let listed: Vec<Value> =
        String::from_utf8_lossy(&o.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["runId"], run_id.as_str());
    assert_eq!(listed[0]["kind"], "PIPELINE_KIND_GENERATE_CHECKLIST");
    assert_eq!(listed[0]["state"], "RUN_STATE_SUCCEEDED");

    let o = tokio::task::spawn_blocking({
        let (c, g, id) = (config_path.clone(), gateway.clone(), run_id.clone());
        move || assay(&c, &["runs", "show", &id, "--gateway", &g, "--json"])
    })
    .await
    .unwrap();
    let shown: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(shown["result"]["checklist"]["items"].as_array().unwrap().len(), 4);
    assert_eq!(shown["usage"]["calls"], 1);

    let o = tokio::task::spawn_blocking({
        let (c, g, id) = (config_path.clone(), gateway.clone(), run_id.clone());
        move || assay(&c, &["runs", "watch", &id, "--gateway", &g, "--json"])
    })
    .await
    .unwrap();
    let events: Vec<Value> =
        String::from_utf8_lossy(&o.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    // The event's kind is its oneof field, the one key beside the run, the sequence and the time.
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e.as_object().unwrap().keys().find(|k| !["runId", "sequence", "time"].contains(&k.as_str())).unwrap())
        .map(String::as_str)
        .collect();
    assert_eq!(kinds, ["started", "checklistReady", "completed"]);
    // A uint64 is a string in the proto3 JSON mapping.
    let seqs: Vec<&str> = events.iter().map(|e| e["sequence"].as_str().unwrap()).collect();
    assert_eq!(seqs, ["1", "2", "3"]);

    let o = tokio::task::spawn_blocking({
        let (c, g) = (config_path.clone(), gateway.clone());
        move || assay(&c, &["runs", "cancel", "no-such-run", "--gateway", &g])
    })
    .await
    .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("NOT_FOUND"));
    mesh.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_refines_a_given_checklist() {
    let backend = ScriptedLlm::start().await;
    backend.set_handler(handler);
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), &backend, ":memory:");
    let checklist = dir.path().join("checklist.json");
    std::fs::write(
        &checklist,
        r#"["Is the reply under 100 words?", "Does it name the order?", "Is the tone polite?", "Does it give a date?"]"#,
    )
    .unwrap();
    let o = tokio::task::spawn_blocking({
        let (config, checklist) = (config.clone(), checklist.clone());
        move || {
            assay(
                &config,
                &[
                    "generate",
                    "--checklist",
                    checklist.to_str().unwrap(),
                    "--refine",
                    "tagger,selector",
                    "--max-questions",
                    "2",
                ],
            )
        }
    })
    .await
    .unwrap();
    assert_eq!(o.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&o.stderr));
    let refined: Value = serde_json::from_slice(&o.stdout).unwrap();
    let ids: Vec<&str> = refined["items"].as_array().unwrap().iter().map(|i| i["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 2, "{refined}");
    assert!(ids.iter().all(|id| ["q1", "q2", "q3", "q4"].contains(id)));
    // Four tagger calls, then one embedding call for the selector.
    let requests = backend.requests();
    assert_eq!(requests.iter().filter(|r| r.is_chat()).count(), 4);
    assert!(requests.iter().any(|r| r.is_embeddings()));

    let o = tokio::task::spawn_blocking({
        let (config, checklist) = (config.clone(), checklist.clone());
        move || assay(&config, &["generate", "--checklist", checklist.to_str().unwrap(), "--refine", "unit_tester"])
    })
    .await
    .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("needs --samples"));
}

/// A gateway address nothing listens on: a command that gets past its own checks fails to
/// connect there, so a refusal that names the problem was made before contacting any server.
fn dead_gateway() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}", listener.local_addr().unwrap())
}

/// `assay` with `args` against `gateway`: its exit code and stderr.
fn refused(gateway: &str, args: &[&str]) -> (Option<i32>, String) {
    let mut all = args.to_vec();
    all.extend(["--gateway", gateway]);
    let o = common::assay(&all);
    (o.status.code(), common::stderr(&o))
}

/// Checks passed, the command went on to the (dead) gateway.
fn reached_the_gateway(code: Option<i32>, err: &str) -> bool {
    code == Some(1) && (err.contains("transport error") || err.contains("onnect"))
}

/// Responder options that cannot be meant are refused before any server is contacted, naming the
/// flag: a template without `{input}` (every record would get the same prompt), an empty or blank
/// template file (it silently became the default), `--respond-samples` outside 1-10 (0 silently
/// meant 1, 11 was refused by the gateway).
#[test]
fn responder_options_that_cannot_be_meant_are_refused_naming_the_flag() {
    let gateway = dead_gateway();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("prompts.jsonl");
    std::fs::write(&data, "{\"id\": \"p1\", \"input\": \"Name a colour.\"}\n").unwrap();
    let file = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let eval = |extra: &[&str]| {
        let mut args = vec!["eval", "--preset", "tick", "--data", data.to_str().unwrap(), "--respond", "openai:m"];
        args.extend(extra);
        refused(&gateway, &args)
    };

    let constant = file("constant.txt", "Answer the question politely.\n");
    let (code, err) = eval(&["--respond-template", &constant]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("--respond-template")
            && err.contains("constant.txt")
            && err.contains("no {input} in the template"),
        "{err}"
    );
    for (name, text, what) in [("empty.txt", "", "is empty"), ("blank.txt", "  \n\t\n", "holds only whitespace")] {
        let path = file(name, text);
        let (code, err) = eval(&["--respond-template", &path]);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("--respond-template") && err.contains(name) && err.contains(what), "{name}: {err}");
    }
    // The second of two templates is checked as the first.
    let good = file("good.txt", "Answer briefly: {input}\n");
    let (code, err) = eval(&["--respond-template", &good, "--respond-template", &constant]);
    assert!(code == Some(1) && err.contains("constant.txt") && err.contains("no {input}"), "{err}");

    // A usage error, as `--samples 0` is (exit 2).
    for n in ["0", "11"] {
        let (code, err) = eval(&["--respond-samples", n]);
        assert_eq!(code, Some(2), "--respond-samples {n}: {err}");
        assert!(err.contains("--respond-samples") && err.contains("give 1 to 10"), "--respond-samples {n}: {err}");
    }

    // What can be meant goes on to the gateway.
    let (code, err) = eval(&["--respond-template", &good, "--respond-samples", "10"]);
    assert!(reached_the_gateway(code, &err), "{err}");
}

/// A CSV file the run cannot use is refused before any server is contacted, naming the column,
/// the header and the line: a column the run needs missing (only when it needs it), a column the
/// records are read from named twice (the last silently won), a row of more or fewer cells than
/// the header (the gateway's field errors, or cells silently dropped), also past the rows read
/// before the run starts (`--open`).
#[test]
fn csv_files_the_run_cannot_use_are_refused_naming_the_column_header_and_line() {
    let gateway = dead_gateway();
    let dir = tempfile::tempdir().unwrap();
    let checklist = dir.path().join("checklist.json");
    std::fs::write(&checklist, r#"["Is it short?"]"#).unwrap();
    let data = |text: &str| {
        let p = dir.path().join("data.csv");
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let eval = |csv: &str, extra: &[&str]| {
        let path = data(csv);
        let mut args = vec!["eval", "--preset", "tick", "--data", path.as_str()];
        args.extend(extra);
        refused(&gateway, &args)
    };
    let score = |csv: &str| {
        let path = data(csv);
        refused(&gateway, &["score", "--checklist", checklist.to_str().unwrap(), "--data", &path])
    };

    // No input column, the default names: the preset generates from the input.
    let (code, err) = eval("id,question,target\n1,Why?,Because.\n", &[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("data.csv:1: no column \"input\"")
            && err.contains("the columns are id, question, target")
            && err.contains("--input-field"),
        "{err}"
    );
    // ... the responders answer it.
    let (code, err) = eval("id,question\n1,Why?\n", &["--respond", "openai:m"]);
    assert!(code == Some(1) && err.contains("no column \"input\"") && err.contains("responders"), "{err}");
    // ... mapped, or not needed: on to the gateway.
    let (code, err) = eval("id,question,target\n1,Why?,Because.\n", &["--input-field", "question"]);
    assert!(reached_the_gateway(code, &err), "{err}");
    let (code, err) = score("id,question,target\n1,Why?,Because.\n");
    assert!(reached_the_gateway(code, &err), "score needs no input: {err}");
    let (code, err) = eval("id,input\n1,Why?\n", &["--respond", "openai:m"]);
    assert!(reached_the_gateway(code, &err), "the responders write the targets: {err}");
    // No target column: what is scored.
    let (code, err) = score("id,input,answer\n1,Why?,Because.\n");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("data.csv:1: no column \"target\"")
            && err.contains("id, input, answer")
            && err.contains("--target-field"),
        "{err}"
    );

    // A column read twice.
    let (code, err) = eval("id,input,input,target\n1,a,b,c\n", &[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("data.csv:1: the header names column \"input\" twice (columns 2 and 3)")
            && err.contains("the columns are id, input, input, target"),
        "{err}"
    );
    // A column nothing reads may repeat.
    let (code, err) = eval("id,input,target,note,note\n1,a,b,x,y\n", &[]);
    assert!(reached_the_gateway(code, &err), "{err}");

    // Ragged rows: the line as a spreadsheet numbers it (the header is line 1).
    let (code, err) = eval("id,input,target\n1,a,b\n2,c\n3,d,e\n", &[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("data.csv:3: 2 cells, the header has 3"), "{err}");
    let (code, err) = score("id,input,target\n1,a,b,extra\n");
    assert!(code == Some(1) && err.contains("data.csv:2: 4 cells, the header has 3"), "{err}");
    // A quoted cell over two lines: the file's line and the spreadsheet's row.
    let (code, err) = eval("id,input,target\n1,\"a\nb\",c\n2,d\n", &[]);
    assert!(code == Some(1) && err.contains("data.csv:4 (row 3): 2 cells, the header has 3"), "{err}");
    // Past the first rows, streamed into an open run: refused before it starts.
    let mut rows: String = "id,input,target\n".into();
    rows.extend((0..50).map(|i| format!("{i},in {i},out {i}\n")));
    rows.push_str("50,in\n");
    let (code, err) = eval(&rows, &["--open"]);
    assert!(code == Some(1) && err.contains("data.csv:52: 2 cells, the header has 3"), "{err}");
}

/// `assay --help` fits on one screen: every command on one line of at most 100 characters, the
/// whole under 40 lines; each command's own help keeps the detail.
#[test]
fn top_level_help_fits_on_one_screen() {
    let o = common::assay_at_width(100, &["--help"]);
    assert_eq!(o.status.code(), Some(0));
    let help = String::from_utf8_lossy(&o.stdout);
    assert!(help.lines().count() < 40, "{} lines:\n{help}", help.lines().count());
    let commands: Vec<&str> =
        help.lines().skip_while(|l| *l != "Commands:").skip(1).take_while(|l| !l.is_empty()).collect();
    assert!(commands.len() >= 10, "{help}");
    for line in &commands {
        assert!(line.len() <= 100, "a long command line: {line}");
    }
    let eval = common::assay(&["eval", "--help"]);
    assert!(
        String::from_utf8_lossy(&eval.stdout).contains("Exit codes: 0 all scored"),
        "the detail stays in eval --help"
    );
}

/// The subcommands a help lists under `Commands:` (a command's line starts with two spaces and
/// its name; wrapped descriptions are indented further), `help` aside.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

/// Every `--help`, the top level's and every subcommand's at any depth, is wrapped to the
/// terminal: at 80 columns no line of it (usage, options, descriptions, commands) is longer than
/// 100 characters (a long option name may overhang a little) and nearly all fit in 80; on a wider
/// terminal lines stop at 100.
#[test]
fn every_help_wraps_to_the_terminal() {
    let mut todo: Vec<Vec<String>> = vec![Vec::new()];
    let mut seen = 0;
    while let Some(path) = todo.pop() {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        let command = format!("assay {}", args.join(" "));
        let mut help = String::new();
        for columns in [250, 80] {
            let o = common::assay_at_width(columns, &args);
            assert_eq!(o.status.code(), Some(0), "{command}: {}", common::stderr(&o));
            help = String::from_utf8(o.stdout).expect("utf-8 help");
            for line in help.lines() {
                let width = line.chars().count();
                assert!(width <= 100, "`{command}` at {columns} columns: a line of {width} characters:\n{line}");
            }
        }
        let wide = help.lines().filter(|l| l.chars().count() > 80).count();
        assert!(wide * 20 <= help.lines().count(), "`{command}` is not wrapped to 80 columns:\n{help}");
        seen += 1;
        for sub in subcommands(&help) {
            let mut next = path.clone();
            next.push(sub);
            todo.push(next);
        }
    }
    assert!(seen >= 15, "only {seen} helps found");
}
