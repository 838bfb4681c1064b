//! The delta judge rejects what it must, and only that (issue 31, point 6), and checks N+1 consistency
//! (point 5, service side), over the running mesh's delta-judge gRPC against the scripted
//! OpenAI-compatible backend:
//! - a removal an issue asked for (a redundant list dropped) is accepted, the drop a note;
//! - sentences shortened under the 15-word target are accepted, with a note;
//! - the verdict is the model's answer: a YES at P = 0.55 is accepted by default and rejected only
//!   when the request sets `min_fix_confidence` 0.6;
//! - a new 30-word sentence is still a readability rejection;
//! - CheckConsistency: YES is consistent, NO carries the model's sentence, an empty section is
//!   INVALID_ARGUMENT naming it, with no model call.

use assay_proto::common::v1 as pb;
use assay_proto::delta_judge::v1::delta_judge_service_client::DeltaJudgeServiceClient;
use assay_proto::delta_judge::v1::{CheckConsistencyRequest, VerifyRequest, VerifyResponse};
use assay_testkit::{RecordedRequest, Reply};
use assay_tests::MeshSandbox;
use tonic::Code;
use tonic::transport::Channel;
use tonic_types::StatusExt;

/// P(YES) the scripted model gives an issue, by the issue id in the prompt (every answer is YES).
fn p_yes(issue_id: &str) -> f64 {
    match issue_id {
        "hesitant" => 0.55,
        _ => 0.95,
    }
}

/// The scripted model: a YES/NO per verified issue with first-token logprobs; the consistency
/// check answers NO with a sentence when the checked section still speaks of three stages.
fn handler(r: &RecordedRequest) -> Reply {
    let prompt = r.last_user_message().unwrap_or_default();
    if prompt.contains("The section to check") {
        let checked = prompt.split("<section role=\"checked\">").nth(1).unwrap_or_default();
        return if checked.contains("three stages") {
            Reply::with_logprobs(
                "NO. It still speaks of three stages, while the previous section now names four.",
                vec![("NO", (0.9f64).ln()), ("YES", (0.1f64).ln())],
            )
            .usage(300, 18)
        } else {
            Reply::with_logprobs("YES", vec![("YES", (0.97f64).ln()), ("NO", (0.03f64).ln())]).usage(300, 1)
        };
    }
    let id = prompt.lines().find_map(|l| l.strip_prefix("- id: ")).unwrap_or_default();
    let p = p_yes(id);
    Reply::with_logprobs("YES", vec![("YES", p.ln()), ("NO", (1.0 - p).ln())]).usage(200, 1)
}

fn section(id: &str, content: &str) -> pb::Section {
    pb::Section { id: id.into(), index: 1, title: "Tools".into(), content: content.into() }
}

fn issue(id: &str, criterion: &str, description: &str, fix_instruction: &str) -> pb::JudgeIssue {
    pb::JudgeIssue {
        id: id.into(),
        criterion: criterion.into(),
        severity: pb::Severity::Minor as i32,
        section_id: "s1".into(),
        description: description.into(),
        fix_instruction: fix_instruction.into(),
        ..Default::default()
    }
}

async fn verify(
    client: &mut DeltaJudgeServiceClient<Channel>,
    before: &str,
    after: &str,
    issues: Vec<pb::JudgeIssue>,
    min_fix_confidence: Option<f64>,
) -> VerifyResponse {
    client
        .verify(VerifyRequest {
            before: Some(section("s1", before)),
            after: Some(section("s1", after)),
            issues,
            min_fix_confidence,
            ..Default::default()
        })
        .await
        .expect("verify answers")
        .into_inner()
}

fn heuristic<'a>(r: &'a VerifyResponse, name: &str) -> &'a assay_proto::delta_judge::v1::HeuristicCheck {
    r.heuristics.iter().find(|h| h.name == name).expect("the check is reported")
}

const LIST_BEFORE: &str = "## What you need\n\nTo bake this bread you need a large bowl, a wooden spoon, a kitchen scale \
and a loaf tin. The bowl should hold at least three litres so the dough can rise without spilling over.\n\n\
- a large bowl\n- a wooden spoon\n- a kitchen scale\n- a loaf tin\n\nWeigh the flour on the scale rather than \
measuring it in cups, because cups give a different amount every time you fill them.\n";

const LIST_AFTER: &str = "## What you need\n\nTo bake this bread you need a large bowl, a wooden spoon, a kitchen scale \
and a loaf tin. The bowl should hold at least three litres so the dough can rise without spilling over.\n\n\
Weigh the flour on the scale rather than measuring it in cups, because cups give a different amount every time \
you fill them.\n";

/// The issue asks to remove a redundant list; the list's four items go. The old structure check
/// rejected any drop of list items ("structure lost: list items 4 -> 0").
#[tokio::test]
async fn a_removal_an_issue_asked_for_is_accepted_with_a_note() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(handler);
    let mut client = DeltaJudgeServiceClient::new(sandbox.channel(sandbox.mesh().addrs.delta_judge).await);
    let asked = issue(
        "dup-list",
        "pedagogical_structure",
        "The bullet list repeats the tools the paragraph above already names.",
        "Remove the redundant list of tools.",
    );
    let r = verify(&mut client, LIST_BEFORE, LIST_AFTER, vec![asked], None).await;
    assert!(r.accepted, "{:?} {:?}", r.rejection_reasons, r.heuristics);
    let structure = heuristic(&r, "structure");
    assert!(structure.passed, "{structure:?}");
    assert_eq!(r.notes, ["structure changed as issue dup-list asked (\"remove\"): list items 4 -> 0"], "{r:?}");
    assert!(r.issues[0].fixed);

    // The same drop for an issue that asked for something else is still a rejection.
    let other = issue("vague", "clarity_readability", "The bowl size is vague.", "Give the bowl size in litres.");
    let r = verify(&mut client, LIST_BEFORE, LIST_AFTER, vec![other], None).await;
    assert!(!r.accepted);
    assert_eq!(r.rejection_reasons, ["structure lost: list items 4 -> 0"]);
    assert!(r.notes.is_empty());
    sandbox.shutdown().await.unwrap();
}

const LONG_BEFORE: &str = "Yeast is a living fungus that feeds on the sugars in flour and releases gas into the dough. \
The gas is trapped by a network of gluten that forms as you knead the dough by hand. \
Warm water wakes the yeast up quickly, but water that is too hot will kill it within minutes. \
Most recipes ask for water at about body temperature, which feels neither warm nor cold on your wrist.";

const SHORT_AFTER: &str = "Yeast is a living fungus that feeds on sugars in flour. It releases gas into the dough, \
which makes it rise. A network of gluten traps that gas as you knead. Warm water wakes the yeast up quickly and \
gently. Water that is too hot kills it within minutes. Most recipes ask for water at about body temperature. \
It feels neither warm nor cold on the inside of your wrist.";

/// Sentences go from ~18 to ~10 words on average: the old check called it a readability regression.
#[tokio::test]
async fn shorter_sentences_are_accepted_with_a_note() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(handler);
    let mut client = DeltaJudgeServiceClient::new(sandbox.channel(sandbox.mesh().addrs.delta_judge).await);
    let wordy = issue(
        "wordy",
        "clarity_readability",
        "The sentences are long for beginners.",
        "Split the sentences so each says one thing.",
    );
    let r = verify(&mut client, LONG_BEFORE, SHORT_AFTER, vec![wordy], None).await;
    assert!(r.accepted, "{:?}", r.rejection_reasons);
    let read = r.readability.as_ref().unwrap();
    assert!(read.average_sentence_words < 11.0 && !read.within_targets, "{read:?}");
    assert!(heuristic(&r, "readability").passed);
    assert_eq!(r.notes.len(), 1, "{:?}", r.notes);
    assert!(r.notes[0].starts_with("shorter sentences: the average fell from 18.0 to 10.0 words"), "{:?}", r.notes);
    sandbox.shutdown().await.unwrap();
}

/// A new 30-word sentence is a move away from the targets: still a rejection.
#[tokio::test]
async fn a_new_thirty_word_sentence_is_still_rejected() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(handler);
    let mut client = DeltaJudgeServiceClient::new(sandbox.channel(sandbox.mesh().addrs.delta_judge).await);
    let added = format!(
        "{LONG_BEFORE} When the dough has doubled in size after about an hour in a warm corner of the kitchen, \
         press it down with your fingers and shape it into a loaf."
    );
    let temp = issue("temp", "completeness", "The rise is not explained.", "Say when the dough is ready.");
    let r = verify(&mut client, LONG_BEFORE, &added, vec![temp], None).await;
    assert!(!r.accepted);
    assert_eq!(r.rejection_reasons.len(), 1, "{:?}", r.rejection_reasons);
    assert!(
        r.rejection_reasons[0].starts_with("readability regressed: a new sentence over 25 words (30 words"),
        "{:?}",
        r.rejection_reasons
    );
    assert!(r.notes.is_empty());
    sandbox.shutdown().await.unwrap();
}

const CLEAR_BEFORE: &str = "Knead the dough for a while until it feels right. Then leave it somewhere to rise for some \
time before you shape it.";
const CLEAR_AFTER: &str = "Knead the dough for ten minutes until it is smooth and springs back. Then leave it in a warm \
place to rise for one hour before you shape it.";

/// The model says YES with P = 0.55: fixed by default (the old rule required 0.6 when logprobs came
/// back); with `min_fix_confidence` 0.6 the same answer counts as not fixed, reason stated.
#[tokio::test]
async fn a_hesitant_yes_is_fixed_unless_min_fix_confidence_demands_more() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(handler);
    let mut client = DeltaJudgeServiceClient::new(sandbox.channel(sandbox.mesh().addrs.delta_judge).await);
    let hesitant = || issue("hesitant", "clarity_readability", "The kneading time is vague.", "Say how long to knead.");
    let r = verify(&mut client, CLEAR_BEFORE, CLEAR_AFTER, vec![hesitant()], None).await;
    assert!(r.accepted, "{:?}", r.rejection_reasons);
    assert!(r.issues[0].fixed && r.issues[0].answer == "YES");
    assert!((r.issues[0].confidence.unwrap() - 0.55).abs() < 1e-6, "{:?}", r.issues[0]);

    let r = verify(&mut client, CLEAR_BEFORE, CLEAR_AFTER, vec![hesitant()], Some(0.6)).await;
    assert!(!r.accepted);
    assert!(!r.issues[0].fixed && r.issues[0].answer == "YES");
    assert_eq!(r.rejection_reasons, ["issue hesitant answered YES at confidence 0.55, below min_fix_confidence 0.60"]);

    // Out of range: INVALID_ARGUMENT naming the field.
    let err = client
        .verify(VerifyRequest {
            before: Some(section("s1", CLEAR_BEFORE)),
            after: Some(section("s1", CLEAR_AFTER)),
            issues: vec![hesitant()],
            min_fix_confidence: Some(1.5),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let fields: Vec<String> =
        err.get_details_bad_request().unwrap().field_violations.into_iter().map(|f| f.field).collect();
    assert_eq!(fields, ["min_fix_confidence"]);
    sandbox.shutdown().await.unwrap();
}

const STAGES_NEW: &str = "A funnel has four stages: awareness, interest, desire and action. People move through them \
in that order.";

fn consistency(previous: &str, checked: &str) -> CheckConsistencyRequest {
    CheckConsistencyRequest {
        previous: Some(pb::Section {
            id: "stages".into(),
            index: 1,
            title: "The stages".into(),
            content: previous.into(),
        }),
        section: Some(pb::Section {
            id: "example".into(),
            index: 2,
            title: "An example".into(),
            content: checked.into(),
        }),
        model: None,
    }
}

fn consistency_calls(sandbox: &MeshSandbox) -> usize {
    sandbox
        .llm
        .requests()
        .iter()
        .filter(|r| r.last_user_message().unwrap_or_default().contains("The section to check"))
        .count()
}

#[tokio::test]
async fn check_consistency_answers_yes_no_with_reason_and_refuses_empty_sections() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(handler);
    let mut client = DeltaJudgeServiceClient::new(sandbox.channel(sandbox.mesh().addrs.delta_judge).await);

    let fits = "A bakery walks a customer through all four stages, from a photo online to a cake sold.";
    let r = client.check_consistency(consistency(STAGES_NEW, fits)).await.unwrap().into_inner();
    assert!(r.consistent && r.reason.is_empty(), "{r:?}");
    assert!((r.confidence.unwrap() - 0.97).abs() < 1e-6);
    let model = r.model.unwrap();
    assert_eq!(model.phase, "stage_6_delta_judge");
    assert!(model.logprobs_requested);
    assert_eq!(r.usage.unwrap().calls, 1);
    assert_eq!(consistency_calls(&sandbox), 1);
    // Both sections reach the model, fenced between the prompt's tags.
    let prompt = sandbox.llm.requests().last().unwrap().last_user_message().unwrap();
    assert!(prompt.contains("The stages\n\nA funnel has four stages") && prompt.contains(fits), "{prompt}");

    let stale = "A bakery walks a customer through the three stages, from a photo online to a cake sold.";
    let r = client.check_consistency(consistency(STAGES_NEW, stale)).await.unwrap().into_inner();
    assert!(!r.consistent);
    assert_eq!(r.reason, "It still speaks of three stages, while the previous section now names four.");
    assert!((r.confidence.unwrap() - 0.9).abs() < 1e-6);
    assert_eq!(consistency_calls(&sandbox), 2);

    for (req, field) in [
        (consistency(STAGES_NEW, "  \n"), "section.content"),
        (consistency("", stale), "previous.content"),
        (CheckConsistencyRequest { section: None, ..consistency(STAGES_NEW, stale) }, "section"),
    ] {
        let err = client.check_consistency(req).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        let fields: Vec<String> =
            err.get_details_bad_request().unwrap().field_violations.into_iter().map(|f| f.field).collect();
        assert!(fields.contains(&field.to_string()), "{field} missing from {fields:?}");
    }
    assert_eq!(consistency_calls(&sandbox), 2, "bad input never reaches the model");
    sandbox.shutdown().await.unwrap();
}
