//! A caller's `top_p` and `max_tokens` reach the backend from the delta judge's issue checks
//! (requests recorded by the scripted OpenAI-compatible backend).

use std::sync::Arc;

use assay_delta_judge::DeltaJudgeCore;
use assay_domain::verify::{DeltaJudge, VerifyRequest};
use assay_domain::{JudgeIssue, ModelSpec, Section, Severity};
use assay_llm::{ModelHub, OpenAiConfig};
use assay_testkit::{Reply, ScriptedLlm};

const TOP_P: f64 = 0.5;
const MAX_TOKENS: u64 = 777;

fn section(content: &str) -> Section {
    Section { id: "s1".into(), index: 0, title: "Intro".into(), content: content.into() }
}

#[tokio::test]
async fn issue_checks_send_the_callers_top_p_and_max_tokens() {
    let llm = ScriptedLlm::start().await;
    llm.set_handler(|_| Reply::with_logprobs("YES", vec![("YES", -0.1), ("NO", -2.4)]));
    let mut cfg = OpenAiConfig::new(llm.base_url());
    cfg.max_retries = 0;
    let core = DeltaJudgeCore::new(Arc::new(ModelHub::single_openai(cfg).unwrap()));
    let issue = JudgeIssue {
        id: "i1".into(),
        criterion: "clarity_readability".into(),
        severity: Severity::Major,
        section_id: "s1".into(),
        description: "The explanation is vague.".into(),
        fix_instruction: "Say what the function returns.".into(),
        location: String::new(),
        raised_by: Vec::new(),
        context_window: String::new(),
    };
    let request = VerifyRequest {
        before: section("The function reads a file. It gives you something back."),
        after: section("The function reads a file. It returns the text as a string."),
        issues: vec![issue],
        model: ModelSpec { top_p: Some(TOP_P), max_tokens: Some(MAX_TOKENS as u32), ..ModelSpec::default() },
        ..VerifyRequest::default()
    };
    let outcome = core.verify(request).await.unwrap();
    assert_eq!(outcome.model.max_tokens, MAX_TOKENS as u32, "the record names the limit sent");
    let chats: Vec<_> = llm.requests().into_iter().filter(|r| r.is_chat()).collect();
    assert_eq!(chats.len(), 1, "one check per issue");
    for r in chats {
        assert_eq!(r.body["top_p"].as_f64(), Some(TOP_P), "top_p: {}", r.body);
        let limit = r.body.get("max_tokens").or_else(|| r.body.get("max_completion_tokens"));
        assert_eq!(limit.and_then(|v| v.as_u64()), Some(MAX_TOKENS), "max tokens: {}", r.body);
    }
}
