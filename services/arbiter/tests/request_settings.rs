//! A caller's `top_p` and `max_tokens` reach the backend from the arbiter's synthesis calls
//! (requests recorded by the scripted OpenAI-compatible backend).

use std::collections::BTreeMap;
use std::sync::Arc;

use assay_arbiter::ArbiterCore;
use assay_domain::arbiter::{Arbiter, ConsolidateRequest};
use assay_domain::document::default_criteria;
use assay_domain::{JudgeIssue, JudgeVerdict, ModelSpec, Section, Severity};
use assay_llm::{ModelHub, OpenAiConfig};
use assay_testkit::{Reply, ScriptedLlm, hash_embedding};
use serde_json::json;

const TOP_P: f64 = 0.5;
const MAX_TOKENS: u64 = 777;

fn verdict(judge: &str, score: f64) -> JudgeVerdict {
    let criterion_scores: BTreeMap<String, f64> = default_criteria().into_iter().map(|c| (c.name, score)).collect();
    JudgeVerdict {
        judge_id: judge.into(),
        criterion_scores,
        issues: vec![JudgeIssue {
            id: format!("{judge}-1"),
            criterion: "clarity_readability".into(),
            severity: Severity::Critical,
            section_id: "s1".into(),
            description: "The explanation is vague.".into(),
            fix_instruction: "Say what the function returns.".into(),
            location: String::new(),
            raised_by: vec![judge.into()],
            context_window: String::new(),
        }],
        overall_score: score,
        ..JudgeVerdict::default()
    }
}

#[tokio::test]
async fn synthesis_sends_the_callers_top_p_and_max_tokens() {
    let llm = ScriptedLlm::start().await;
    llm.set_handler(|r| {
        if r.is_embeddings() {
            Reply::embeddings(r.embedding_inputs().iter().map(|t| hash_embedding(t, 8)).collect())
        } else {
            Reply::json(json!({"instruction": "Say what the function returns."}))
        }
    });
    let mut cfg = OpenAiConfig::new(llm.base_url());
    cfg.max_retries = 0;
    let core = ArbiterCore::new(Arc::new(ModelHub::single_openai(cfg).unwrap()));
    let request = ConsolidateRequest {
        verdicts: vec![verdict("j1", 0.6), verdict("j2", 0.7)],
        sections: vec![Section { id: "s1".into(), index: 0, title: "Intro".into(), content: "Some text.".into() }],
        criteria: default_criteria(),
        model: ModelSpec { top_p: Some(TOP_P), max_tokens: Some(MAX_TOKENS as u32), ..ModelSpec::default() },
        match_threshold: 0.8,
        ..ConsolidateRequest::default()
    };
    let outcome = core.consolidate(request).await.unwrap();
    let record = outcome.model_record.expect("synthesis ran");
    assert_eq!(record.max_tokens, MAX_TOKENS as u32, "the record names the limit sent");
    let chats: Vec<_> = llm.requests().into_iter().filter(|r| r.is_chat()).collect();
    assert!(!chats.is_empty(), "no synthesis call");
    for r in chats {
        assert_eq!(r.body["top_p"].as_f64(), Some(TOP_P), "top_p: {}", r.body);
        let limit = r.body.get("max_tokens").or_else(|| r.body.get("max_completion_tokens"));
        assert_eq!(limit.and_then(|v| v.as_u64()), Some(MAX_TOKENS), "max tokens: {}", r.body);
    }
}
