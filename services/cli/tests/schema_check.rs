//! A server that accepts `response_format: json_schema` with a 200 and ignores it (vLLM with a key
//! it no longer knows, llama.cpp with a grammar it cannot parse) seen through a whole run: `assay
//! eval` over the real binary and its in-process mesh, against a scripted backend (a real HTTP
//! server on loopback) that answers `json_schema` requests with JSON that breaks every stage's
//! schema and enforces `json_object` with a schema. The run notices within a few replies, moves
//! the model down the ladder, finishes every record, and says so in its usage and model records.

use assay_testkit::{RecordedRequest, Reply, ScriptedLlm, schema_reply};
use serde_json::{Value, json};

mod common;
use common::{assay_async as assay, config_file, lines, stderr};

/// JSON that matches no stage's schema under `json_schema`; a conforming instance of the schema
/// under `json_object` (the grammar a llama.cpp server builds from it).
fn ignores_json_schema(request: &RecordedRequest) -> Reply {
    match request.body["response_format"]["type"].as_str() {
        Some("json_schema") => Reply::json(json!({"note": "a reply written as if no schema had been sent"})),
        Some("json_object") => {
            let mut as_native = request.clone();
            as_native.body["response_format"] =
                json!({"type": "json_schema", "json_schema": {"schema": request.body["response_format"]["schema"]}});
            schema_reply(&as_native)
        }
        _ => schema_reply(request),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_notices_a_schema_form_accepted_and_ignored_and_moves_down() {
    let backend = ScriptedLlm::start().await;
    backend.set_handler(ignores_json_schema);
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), &backend, ":memory:");
    let data = dir.path().join("records.jsonl");
    let records: String = (0..12)
        .map(|i| {
            format!("{}\n", json!({"id": format!("r{i}"), "input": format!("Question {i}?"), "target": "An answer."}))
        })
        .collect();
    std::fs::write(&data, records).unwrap();
    let out = dir.path().join("scores.jsonl");
    let o = assay(
        &config,
        &["eval", "--preset", "tick", "--data", data.to_str().unwrap(), "--out", out.to_str().unwrap(), "--json"],
    )
    .await;
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "stderr: {err}");
    let summary: Value = serde_json::from_slice(&o.stdout).expect("a JSON summary");
    assert_eq!(summary["failed"], 0, "every record finished: {summary}");
    let usage = &summary["usage"];
    let violations = usage["schemaViolations"].as_u64().unwrap_or(0);
    assert!(violations >= 3, "the broken replies are counted: {usage}");

    // Every reply under json_schema broke its schema; after the third, no request went out in
    // that form, only those already in flight came back (the limit lets at most its first burst
    // out at once).
    let requests = backend.requests();
    let native = requests.iter().filter(|r| r.body["response_format"]["type"] == "json_schema").count();
    let object = requests.iter().filter(|r| r.body["response_format"]["type"] == "json_object").count();
    assert_eq!(native as u64, violations, "each json_schema reply counted once: {usage}");
    assert!(object >= 12, "the rest went as json_object with the schema: {native} {object}");
    let last_native = requests.iter().rposition(|r| r.body["response_format"]["type"] == "json_schema").unwrap();
    let first_object = requests.iter().position(|r| r.body["response_format"]["type"] == "json_object").unwrap();
    assert!(first_object <= last_native + 1 || native <= 3, "moved down once noticed");
    assert!(
        requests[first_object..].iter().all(|r| r.body["response_format"]["type"] != "json_schema"),
        "never back up the ladder"
    );

    // What produced the scores says so: the scorer's model record names the form it used.
    let forms: Vec<&str> = summary["models"]
        .as_array()
        .expect("model records")
        .iter()
        .filter_map(|m| m["structuredOutput"].as_str())
        .collect();
    assert!(forms.contains(&"json_object"), "the model records name the form: {summary}");
    assert_eq!(lines(&out).len(), 12);
}
