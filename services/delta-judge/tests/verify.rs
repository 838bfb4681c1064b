//! Verify and CompareTexts over real gRPC on port 0, against the scripted OpenAI-compatible backend.

use std::sync::Arc;
use std::time::Duration;

use assay_delta_judge::DeltaJudgeCore;
use assay_llm::ModelHub;
use assay_llm::OpenAiConfig;
use assay_proto::common::v1 as pb;
use assay_proto::delta_judge::v1::delta_judge_service_client::DeltaJudgeServiceClient;
use assay_proto::delta_judge::v1::{
    CompareTextsRequest, CompareTextsResponse, ConvergenceMode, QualityLock, VerifyRequest, VerifyResponse,
};
use assay_testkit::{RecordedRequest, Reply, ScriptedLlm, TestServer};
use sha2::{Digest, Sha256};
use tonic::Code;
use tonic::transport::Channel;
use tonic_types::StatusExt;

struct Harness {
    llm: ScriptedLlm,
    _server: TestServer,
    client: DeltaJudgeServiceClient<Channel>,
}

async fn harness() -> Harness {
    let llm = ScriptedLlm::start().await;
    let mut cfg = OpenAiConfig::new(llm.base_url());
    cfg.default_model = "judge-1".into();
    cfg.embedding_model = "embed-1".into();
    // One request per call and no client-side breaker: the cascade's own breaker is under test.
    cfg.max_retries = 0;
    cfg.base_backoff = Duration::from_millis(1);
    cfg.breaker_failures = 1_000;
    let hub = Arc::new(ModelHub::single_openai(cfg).unwrap());
    let server = TestServer::start(
        assay_delta_judge::routes(Arc::new(DeltaJudgeCore::new(hub))),
        &[assay_proto::service_names::DELTA_JUDGE],
    )
    .await;
    let client = DeltaJudgeServiceClient::new(server.channel().await);
    Harness { llm, _server: server, client }
}

/// The issue id a chat prompt asks about.
fn issue_of(r: &RecordedRequest) -> String {
    let msg = r.last_user_message().unwrap_or_default();
    msg.lines().find_map(|l| l.strip_prefix("- id: ")).unwrap_or_default().to_string()
}

fn yes(p_yes: f64) -> Reply {
    let answer = if p_yes >= 0.5 { "YES" } else { "NO" };
    let mut alts = vec![("YES", p_yes.ln()), ("NO", (1.0 - p_yes).ln())];
    if answer == "NO" {
        alts.reverse();
    }
    Reply::with_logprobs(answer, alts).usage(100, 1)
}

fn section(content: &str) -> pb::Section {
    pb::Section { id: "s1".into(), index: 0, title: "Intro".into(), content: content.into() }
}

fn issue(id: &str) -> pb::JudgeIssue {
    pb::JudgeIssue {
        id: id.into(),
        criterion: "clarity_readability".into(),
        severity: pb::Severity::Major as i32,
        section_id: "s1".into(),
        description: format!("problem {id}: the explanation is vague"),
        fix_instruction: "Say what the function returns.".into(),
        ..Default::default()
    }
}

const BEFORE: &str = "# Reading files\n\nThe function opens a file and reads it. It is useful in many programs. \
You call it with a path and it gives you something back.\n\n- open the file\n- read the bytes\n\n```rust\nlet text = read(path)?;\n```\n";
const AFTER: &str = "# Reading files\n\nThe function opens a file and reads all of its bytes. It returns the text as a string. \
You call it with a path, and it fails when the file is missing.\n\n- open the file\n- read the bytes\n\n```rust\nlet text = read(path)?;\n```\n";

fn request(before: &str, after: &str, issues: Vec<pb::JudgeIssue>) -> VerifyRequest {
    VerifyRequest { before: Some(section(before)), after: Some(section(after)), issues, ..Default::default() }
}

async fn verify(h: &mut Harness, r: VerifyRequest) -> VerifyResponse {
    h.client.verify(r).await.unwrap().into_inner()
}

#[tokio::test]
async fn accepted_fix_with_logprob_confidence_and_record() {
    let mut h = harness().await;
    h.llm.set_handler(|_| yes(0.95));
    let r = verify(&mut h, request(BEFORE, AFTER, vec![issue("i-1")])).await;
    assert!(r.accepted, "{:?}", r.rejection_reasons);
    assert!(r.rejection_reasons.is_empty());
    let names: Vec<&str> = r.heuristics.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["length", "language", "structure", "readability"]);
    assert!(r.heuristics.iter().all(|c| c.passed), "{:?}", r.heuristics);
    assert_eq!(r.heuristics[1].detail, "language unchanged (English)");
    assert_eq!(r.issues.len(), 1);
    assert!(r.issues[0].fixed && r.issues[0].error.is_empty());
    assert!((r.issues[0].confidence.unwrap() - 0.95).abs() < 1e-6);
    assert!(!r.logprobs_unavailable);
    let usage = r.usage.unwrap();
    assert_eq!((usage.calls, usage.prompt_tokens, usage.completion_tokens), (1, 100, 1));
    let model = r.model.unwrap();
    assert_eq!(model.phase, "stage_6_delta_judge");
    assert_eq!(model.model, "judge-1");
    assert!(model.logprobs_requested);
    let template = include_str!("../prompts/verify_issue.txt");
    assert_eq!(model.prompt_template_sha256, hex::encode(Sha256::digest(template.as_bytes())));
    assert!(r.readability.is_some());
    // The prompt carries the issue and both versions; first-token logprobs were asked for.
    let reqs = h.llm.requests();
    assert_eq!(reqs.len(), 1);
    let body = &reqs[0].body;
    assert_eq!(body["logprobs"], serde_json::json!(true));
    assert_eq!(body["top_logprobs"], serde_json::json!(5));
    let prompt = reqs[0].last_user_message().unwrap();
    for part in ["problem i-1", "Say what the function returns.", "reads it. It is useful", "returns the text"] {
        assert!(prompt.contains(part), "{part} missing from the prompt");
    }
}

#[tokio::test]
async fn unfixed_and_failed_issues_are_rejected_with_reasons() {
    let mut h = harness().await;
    h.llm.set_handler(|r| match issue_of(r).as_str() {
        "i-1" => yes(0.9),
        "i-2" => yes(0.12),
        _ => Reply::status(500),
    });
    let r = verify(&mut h, request(BEFORE, AFTER, vec![issue("i-1"), issue("i-2"), issue("i-3")])).await;
    assert!(!r.accepted);
    let ids: Vec<&str> = r.issues.iter().map(|i| i.issue_id.as_str()).collect();
    assert_eq!(ids, ["i-1", "i-2", "i-3"], "issues keep request order");
    assert!(r.issues[0].fixed);
    assert!(!r.issues[1].fixed && r.issues[1].error.is_empty());
    assert!(!r.issues[2].fixed && !r.issues[2].error.is_empty() && r.issues[2].confidence.is_none());
    assert_eq!(r.rejection_reasons.len(), 2, "{:?}", r.rejection_reasons);
    assert_eq!(r.rejection_reasons[0], "issue i-2 not fixed (the model answered NO, confidence 0.88)");
    assert_eq!(
        (r.issues[0].answer.as_str(), r.issues[1].answer.as_str(), r.issues[2].answer.as_str()),
        ("YES", "NO", "")
    );
    assert!(r.rejection_reasons[1].starts_with("issue i-3 not verified: "), "{:?}", r.rejection_reasons);
    assert_eq!(h.llm.request_count(), 3, "one call per issue, no retries");
    assert_eq!(r.usage.unwrap().calls, 2, "the failed call used nothing");
}

#[tokio::test]
async fn missing_logprobs_are_flagged_and_confidences_left_unset() {
    let mut h = harness().await;
    h.llm.set_handler(|r| if issue_of(r) == "i-1" { Reply::text("YES") } else { Reply::text("NO, still vague") });
    let r = verify(&mut h, request(BEFORE, AFTER, vec![issue("i-1"), issue("i-2")])).await;
    assert!(r.logprobs_unavailable);
    assert!(r.issues.iter().all(|i| i.confidence.is_none()));
    assert!(r.issues[0].fixed && !r.issues[1].fixed);
    assert_eq!(r.rejection_reasons, ["issue i-2 not fixed (the model answered NO)"]);
}

const GERMAN: &str = "Die Funktion öffnet eine Datei und liest den gesamten Inhalt. Sie gibt den Text als \
Zeichenkette zurück und meldet einen Fehler, wenn die Datei fehlt. Man ruft sie mit einem Pfad auf.";
const ENGLISH: &str = "The function opens a file and reads the whole content. It returns the text as a \
string and reports an error when the file is missing. You call it with a path.";

#[tokio::test]
async fn heuristics_catch_language_structure_and_length() {
    let mut h = harness().await;
    let r = verify(&mut h, request(GERMAN, ENGLISH, vec![])).await;
    assert!(!r.accepted);
    assert_eq!(r.rejection_reasons, ["language changed from German to English"]);
    assert!(!r.heuristics[1].passed);

    // Same language, heading and code block dropped.
    let shorter = "# Reading files\n\nThe function opens a file and reads it. It is useful in many programs. \
You call it with a path and it gives you the text back, or an error.\n\n- open the file\n- read the bytes\n";
    let r = verify(&mut h, request(BEFORE, shorter, vec![])).await;
    assert_eq!(r.rejection_reasons, ["structure lost: code blocks 1 -> 0"]);
    let no_heading = AFTER.replace("# Reading files\n\n", "");
    let r = verify(&mut h, request(BEFORE, &no_heading, vec![])).await;
    assert_eq!(r.rejection_reasons, ["structure lost: heading \"Reading files\""]);

    // Too short, and too long with tighter bounds.
    let r = verify(&mut h, request(ENGLISH, "The function reads a file.", vec![])).await;
    assert_eq!(r.rejection_reasons.len(), 1, "{:?}", r.rejection_reasons);
    assert!(r.rejection_reasons[0].starts_with("length ratio 0.1") && r.rejection_reasons[0].ends_with("below 0.5"));
    let mut req = request(ENGLISH, &format!("{ENGLISH} {ENGLISH}"), vec![]);
    req.max_length_ratio = Some(1.5);
    let r = verify(&mut h, req).await;
    assert_eq!(r.rejection_reasons, ["length ratio 2.01 above 1.5"]);
    assert_eq!(h.llm.request_count(), 0, "no issues, no model calls");
}

#[tokio::test]
async fn readability_regression_and_lock_violation_are_rejections() {
    let mut h = harness().await;
    let s16 = "The reader learns how the function opens the file and reads each line into memory today.";
    let before = [s16; 4].join(" ");
    let s32 = "The reader learns how the function opens the file and reads each line into memory today, \
and then the reader sees how the function returns the text to the caller when it is done.";
    let after = [s32; 2].join(" ");
    let mut req = request(&before, &after, vec![]);
    req.locks = vec![
        QualityLock { criterion: "clarity_readability".into(), baseline: 0.8, max_drop: None },
        QualityLock { criterion: "factual_accuracy".into(), baseline: 0.9, max_drop: Some(0.1) },
    ];
    req.criterion_scores = [("clarity_readability".to_string(), 0.73), ("factual_accuracy".to_string(), 0.8)].into();
    let r = verify(&mut h, req).await;
    assert!(!r.accepted);
    assert!(r.rejection_reasons[0].starts_with("readability regressed"), "{:?}", r.rejection_reasons);
    assert_eq!(r.rejection_reasons[1], "lock clarity_readability dropped 0.07 > 0.05");
    assert_eq!(r.rejection_reasons.len(), 2, "a drop of exactly max_drop is allowed: {:?}", r.rejection_reasons);
    assert_eq!(r.lock_violations.len(), 1);
    let read = r.readability.unwrap();
    assert!(!read.within_targets && read.max_sentence_words > 25);
}

#[tokio::test]
async fn bad_input_is_invalid_argument_with_fields_and_no_model_calls() {
    let mut h = harness().await;
    h.llm.set_handler(|_| yes(0.9));
    let mut bad_severity = issue("i-1");
    bad_severity.severity = 9;
    let cases: Vec<(VerifyRequest, Vec<&str>)> = vec![
        (
            VerifyRequest { after: Some(section(AFTER)), issues: vec![issue("i-1")], ..Default::default() },
            vec!["before"],
        ),
        (request(BEFORE, "   ", vec![issue("i-1")]), vec!["after.content"]),
        (
            VerifyRequest {
                before: Some(section(BEFORE)),
                after: Some(pb::Section { id: "s2".into(), ..section(AFTER) }),
                issues: vec![issue("i-1")],
                ..Default::default()
            },
            vec!["after.id", "issues[0].section_id"],
        ),
        (
            VerifyRequest {
                criterion_scores: [("clarity_readability".to_string(), 1.5)].into(),
                locks: vec![QualityLock { criterion: "clarity_readability".into(), baseline: -0.1, max_drop: None }],
                ..request(BEFORE, AFTER, vec![issue("i-1")])
            },
            vec!["criterion_scores[\"clarity_readability\"]", "locks[0].baseline"],
        ),
        (request(BEFORE, AFTER, vec![bad_severity]), vec!["issues[0].severity"]),
        (request(BEFORE, AFTER, (0..101).map(|i| issue(&format!("i-{i}"))).collect()), vec!["issues"]),
    ];
    for (req, fields) in cases {
        let err = h.client.verify(req).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        let bad = err.get_details_bad_request().expect("bad request details");
        let got: Vec<&str> = bad.field_violations.iter().map(|f| f.field.as_str()).collect();
        for f in fields {
            assert!(got.contains(&f), "{f} missing from {got:?}");
        }
    }
    assert_eq!(h.llm.request_count(), 0, "bad input never reaches the model");
}

async fn compare(h: &mut Harness, previous: &str, current: &str, mode: ConvergenceMode) -> CompareTextsResponse {
    h.client
        .compare_texts(CompareTextsRequest {
            previous: previous.into(),
            current: current.into(),
            mode: mode as i32,
            embedding_model: None,
        })
        .await
        .unwrap()
        .into_inner()
}

const DRAFT: &str = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november \
oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu mercury venus earth mars";

fn title_case(text: &str) -> String {
    text.split(' ')
        .map(|w| {
            let mut c = w.chars();
            c.next().map(|f| f.to_uppercase().chain(c).collect::<String>()).unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test]
async fn compare_texts_char_jaccard_and_embedding_steps() {
    let mut h = harness().await;
    h.llm.set_handler(|r| {
        if r.is_embeddings() {
            Reply::embeddings(r.embedding_inputs().iter().map(|_| vec![0.6, 0.8, 0.0]).collect())
        } else {
            Reply::status(500)
        }
    });
    let p = ConvergenceMode::Permissive;
    // Char: one changed character in 200.
    let a = "x".repeat(200);
    let b = format!("{}y", "x".repeat(199));
    let r = compare(&mut h, &a, &b, p).await;
    assert!(r.converged && !r.diverged && r.decided_by == "char", "{r:?}");
    assert!((r.char_similarity - 0.995).abs() < 1e-12);
    assert!(r.jaccard.is_none() && r.embedding_cosine.is_none());
    // Diverged: unrelated texts.
    let r = compare(&mut h, "The cat sat on the mat.", "Quantum flux capacitors hum loudly!", p).await;
    assert!(r.diverged && !r.converged && r.decided_by == "char", "{r:?}");
    // Jaccard: same 30 tokens, capitalised.
    let r = compare(&mut h, DRAFT, &title_case(DRAFT), p).await;
    assert!(r.converged && r.decided_by == "jaccard", "{r:?}");
    assert_eq!(r.jaccard, Some(1.0));
    assert!((r.jaccard_confidence.unwrap() - 0.6).abs() < 1e-12);
    assert_eq!(h.llm.request_count(), 0, "no embeddings needed so far");
    // Embedding: different words, same vectors.
    let (x, y) = ("the cat sat on the mat today", "the dog sat on the rug today");
    let r = compare(&mut h, x, y, ConvergenceMode::Strict).await;
    assert!(r.converged && r.decided_by == "embedding" && !r.embedding_cached, "{r:?}");
    assert!((r.embedding_cosine.unwrap() - 1.0).abs() < 1e-6);
    assert!(r.degraded_from.is_empty());
    assert_eq!(h.llm.request_count(), 1, "both texts in one batch");
    let r = compare(&mut h, x, y, ConvergenceMode::Strict).await;
    assert!(r.converged && r.embedding_cached, "{r:?}");
    assert_eq!(h.llm.request_count(), 1, "served from the cache");
}

#[tokio::test]
async fn compare_texts_degrades_and_the_breaker_opens() {
    let mut h = harness().await;
    h.llm.set_handler(|_| Reply::status(500));
    let words = DRAFT.split(' ').take(29).collect::<Vec<_>>().join(" ");
    let cap = title_case(&words);
    // Jaccard 1.0 but confidence 0.58: the embedding step is needed and fails.
    let r = compare(&mut h, &words, &cap, ConvergenceMode::Permissive).await;
    assert!(r.converged && r.decided_by == "jaccard" && r.degraded_from == "embedding", "{r:?}");
    assert!(r.degraded_reason.contains("embedding call failed"), "{r:?}");
    let r = compare(&mut h, &words, &cap, ConvergenceMode::Strict).await;
    assert!(!r.converged && r.degraded_from == "embedding", "strict refuses: {r:?}");
    let r = compare(&mut h, &words, &cap, ConvergenceMode::Unspecified).await;
    assert!(r.converged, "unset mode is permissive: {r:?}");
    assert_eq!(h.llm.request_count(), 3);
    // Three consecutive failures opened the breaker: the fourth compare makes no request.
    let r = compare(&mut h, &words, &cap, ConvergenceMode::Strict).await;
    assert!(!r.converged && r.degraded_reason.contains("breaker is open"), "{r:?}");
    assert_eq!(h.llm.request_count(), 3);

    // Bad input: named fields, nothing sent.
    let err = h
        .client
        .compare_texts(CompareTextsRequest { previous: "x".into(), mode: 9, ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let bad = err.get_details_bad_request().unwrap();
    let got: Vec<&str> = bad.field_violations.iter().map(|f| f.field.as_str()).collect();
    assert!(got.contains(&"mode") && got.contains(&"current"), "{got:?}");
    assert_eq!(h.llm.request_count(), 3);
}
