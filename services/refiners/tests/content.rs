//! Patch and ExpandSection over real gRPC on port 0, against the scripted OpenAI-compatible
//! backend, and the remote client over the same service.

use std::sync::Arc;
use std::time::Duration;

use assay_domain::content::ContentRefiner;
use assay_llm::ModelHub;
use assay_llm::OpenAiConfig;
use assay_proto::common::v1 as pb;
use assay_proto::refiners::v1::refiners_service_client::RefinersServiceClient;
use assay_proto::refiners::v1::{ExpandSectionRequest, PatchRequest};
use assay_testkit::{RecordedRequest, Reply, ScriptedLlm, TestServer};
use tonic::Code;
use tonic_types::StatusExt;

struct Harness {
    llm: ScriptedLlm,
    server: TestServer,
}

async fn harness() -> Harness {
    let llm = ScriptedLlm::start().await;
    let mut cfg = OpenAiConfig::new(llm.base_url());
    cfg.default_model = "editor".into();
    cfg.base_backoff = Duration::from_millis(5);
    let hub = Arc::new(ModelHub::single_openai(cfg).unwrap());
    let server = TestServer::start(
        assay_refiners::routes(Arc::new(assay_refiners::ChecklistRefiners::new(hub))),
        &[assay_proto::service_names::REFINERS],
    )
    .await;
    Harness { llm, server }
}

fn section(id: &str, title: &str, content: &str) -> pb::Section {
    pb::Section { id: id.into(), index: 0, title: title.into(), content: content.into() }
}

fn previous() -> pb::Section {
    section(
        "intro",
        "What a funnel is",
        "A sales funnel shows how strangers become customers, step by step, stage by stage.",
    )
}

fn next() -> pb::Section {
    section(
        "example",
        "An example",
        "A bakery posts photos online, offers a free tasting, and finally sells a cake to a regular.",
    )
}

const STAGES: &str = "## The stages\nAwareness comes last. Interest and desire follow.\n\n### Why order matters\nEach stage feeds the next.";

fn patch_request() -> PatchRequest {
    PatchRequest {
        section: Some(section("stages", "The stages", STAGES)),
        issues: vec![pb::JudgeIssue {
            id: "i1".into(),
            criterion: "factual_accuracy".into(),
            severity: pb::Severity::Critical as i32,
            section_id: "stages".into(),
            description: "The order of the stages is wrong".into(),
            fix_instruction: "Put awareness first".into(),
            location: "Awareness comes last.".into(),
            ..Default::default()
        }],
        instruction: "Give the stages in order: awareness, interest, desire, action.".into(),
        constraints: vec!["Keep it short".into()],
        previous: Some(previous()),
        next: Some(next()),
        brief: Some(pb::Brief { objectives: vec!["Name the stages in order".into()], ..Default::default() }),
        model: None,
    }
}

const FIXED: &str = "## The stages\nAwareness comes first, then interest, desire and action.\n\n### Why order matters\nEach stage feeds the next.";

#[tokio::test]
async fn patch_returns_only_the_fixed_section_with_a_diff_summary() {
    let h = harness().await;
    h.llm.push(Reply::text(format!("Here it is.\n<section>\n{FIXED}\n</section>")).usage(300, 40));
    let mut client = RefinersServiceClient::new(h.server.channel().await);
    let out = client.patch(patch_request()).await.unwrap().into_inner();
    assert!(out.rejected_reason.is_empty(), "{}", out.rejected_reason);
    let s = out.section.unwrap();
    assert_eq!((s.id.as_str(), s.title.as_str(), s.content.as_str()), ("stages", "The stages", FIXED));
    assert!(out.diff_summary.starts_with("+1 -1 lines"), "{}", out.diff_summary);
    let usage = out.usage.unwrap();
    assert_eq!((usage.calls, usage.prompt_tokens, usage.completion_tokens), (1, 300, 40));
    assert_eq!(out.model.unwrap().phase, "stage_6_patcher");
    // The prompt carries the section, both anchors, the issue, the instruction and the constraint.
    let prompt = h.llm.requests()[0].last_user_message().unwrap();
    for needle in [
        STAGES,
        "A sales funnel shows",
        "A bakery posts photos",
        "Put awareness first",
        "awareness, interest, desire, action",
        "Keep it short",
        "Name the stages in order",
    ] {
        assert!(prompt.contains(needle), "missing {needle:?} in the prompt");
    }
}

#[tokio::test]
async fn first_and_last_sections_use_the_anchor_they_have() {
    let h = harness().await;
    h.llm.push(Reply::text(FIXED));
    let mut client = RefinersServiceClient::new(h.server.channel().await);
    let out = client.patch(PatchRequest { previous: None, ..patch_request() }).await.unwrap().into_inner();
    assert_eq!(out.section.unwrap().content, FIXED, "a reply without tags is the section");
    let prompt = h.llm.requests()[0].last_user_message().unwrap();
    assert!(prompt.contains("(none: this is the first or last section)"));
    assert!(prompt.contains("A bakery posts photos"));
}

#[tokio::test]
async fn unusable_replies_are_refused_and_still_counted() {
    let h = harness().await;
    let mut client = RefinersServiceClient::new(h.server.channel().await);
    let cases = [
        (Reply::text("<section>\n</section>").usage(100, 2), "the reply is empty"),
        (Reply::text(format!("{FIXED}\n{}", next().content)).usage(100, 60), "repeats the next section"),
        (
            Reply::text("## The stages\nAwareness comes first.").usage(100, 10),
            "drops the section's heading(s): ### Why order matters",
        ),
        (Reply::text(FIXED).finish_reason("length").usage(100, 90), "cut at the token limit"),
    ];
    for (reply, why) in cases {
        h.llm.push(reply);
        let out = client.patch(patch_request()).await.unwrap().into_inner();
        assert!(out.section.is_none());
        assert!(out.rejected_reason.contains(why), "{why}: {}", out.rejected_reason);
        assert_eq!(out.usage.unwrap().prompt_tokens, 100, "usage is reported for refused replies too");
    }
}

#[tokio::test]
async fn expand_regenerates_the_section_towards_the_target_length() {
    let h = harness().await;
    let new = "## The stages\nFirst comes awareness. Then interest grows into desire, and desire into action.\n\n### Why order matters\nSkipping a stage loses people.";
    h.llm.set_handler(move |r: &RecordedRequest| {
        let prompt = r.last_user_message().unwrap_or_default();
        if prompt.contains("about 120 words") && prompt.contains("rewrite it") {
            Reply::text(new)
        } else {
            Reply::status(400)
        }
    });
    let mut client = RefinersServiceClient::new(h.server.channel().await);
    let p = patch_request();
    let out = client
        .expand_section(ExpandSectionRequest {
            section: p.section,
            issues: p.issues,
            instruction: p.instruction,
            target_words: 120,
            previous: p.previous,
            next: p.next,
            brief: p.brief,
            constraints: p.constraints,
            model: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(out.section.unwrap().content, new, "{}", out.rejected_reason);
    assert_eq!(out.model.unwrap().phase, "stage_6_section_expander");
}

#[tokio::test]
async fn bad_edits_name_the_field_and_call_no_model() {
    let h = harness().await;
    let mut client = RefinersServiceClient::new(h.server.channel().await);
    let cases: Vec<(PatchRequest, &str)> = vec![
        (PatchRequest { section: None, ..patch_request() }, "section"),
        (PatchRequest { section: Some(section("stages", "", "  ")), ..patch_request() }, "section.content"),
        (PatchRequest { instruction: String::new(), issues: vec![], ..patch_request() }, "instruction"),
        (PatchRequest { next: Some(section("stages", "", "dup")), ..patch_request() }, "next.id"),
        (
            {
                let mut r = patch_request();
                r.issues[0].severity = 9;
                r
            },
            "issues[0].severity",
        ),
        (PatchRequest { constraints: vec!["x".into(); 33], ..patch_request() }, "constraints"),
    ];
    for (request, field) in cases {
        let status = client.patch(request).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
        let fields: Vec<String> =
            status.get_details_bad_request().unwrap().field_violations.into_iter().map(|v| v.field).collect();
        assert!(fields.iter().any(|f| f == field), "{field} not in {fields:?}");
    }
    let p = patch_request();
    let status = client
        .expand_section(ExpandSectionRequest {
            section: p.section,
            instruction: p.instruction,
            target_words: 9_000,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(h.llm.request_count(), 0);
}

#[tokio::test]
async fn the_remote_client_patches_through_the_service() {
    let h = harness().await;
    h.llm.push(Reply::text(FIXED));
    let remote = assay_rpc::remote::RemoteRefiners::new(h.server.channel().await, None);
    let request = assay_proto::convert::refiners::patch_request(patch_request()).unwrap();
    let out = remote.patch(request).await.unwrap();
    assert_eq!(out.section.unwrap().content, FIXED);
    assert!(out.rejected_reason.is_empty());
    assert_eq!(out.usage.calls, 1);
}
