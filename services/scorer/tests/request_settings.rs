//! A caller's `top_p` and `max_tokens` reach the backend from checklist scoring and from the judge
//! panel (requests recorded by the scripted OpenAI-compatible backend): every stage builds its
//! request with `ResolvedChat::request` (spec over configuration over the stage's default).

use std::sync::Arc;

use assay_domain::document::default_criteria;
use assay_domain::judge::{JudgeSectionsRequest, PanelJudge, SectionJudge};
use assay_domain::{Checklist, ChecklistItem, ModelSpec, ScoreRequest, ScoreTarget, Scorer, Section};
use assay_llm::{ModelHub, OpenAiConfig};
use assay_scorer::ScorerCore;
use assay_testkit::{Reply, ScriptedLlm};
use serde_json::json;

const TOP_P: f64 = 0.5;
const MAX_TOKENS: u64 = 777;

fn spec() -> ModelSpec {
    ModelSpec { top_p: Some(TOP_P), max_tokens: Some(MAX_TOKENS as u32), ..ModelSpec::default() }
}

async fn core(llm: &ScriptedLlm) -> ScorerCore {
    let mut cfg = OpenAiConfig::new(llm.base_url());
    cfg.max_retries = 0;
    ScorerCore::new(Arc::new(ModelHub::single_openai(cfg).unwrap()), 4)
}

/// Every chat request carries the caller's top_p and token limit.
fn assert_spec_reached_backend(llm: &ScriptedLlm) {
    let chats: Vec<_> = llm.requests().into_iter().filter(|r| r.is_chat()).collect();
    assert!(!chats.is_empty(), "the stage made no model call");
    for r in chats {
        assert_eq!(r.body["top_p"].as_f64(), Some(TOP_P), "top_p: {}", r.body);
        let limit = r.body.get("max_tokens").or_else(|| r.body.get("max_completion_tokens"));
        assert_eq!(limit.and_then(|v| v.as_u64()), Some(MAX_TOKENS), "max tokens: {}", r.body);
    }
}

#[tokio::test]
async fn scoring_sends_the_callers_top_p_and_max_tokens() {
    let llm = ScriptedLlm::start().await;
    llm.set_handler(|_| Reply::json(json!({"answers": [{"index": 1, "answer": "YES"}]})));
    let request = ScoreRequest {
        checklist: Checklist {
            id: "c".into(),
            items: vec![ChecklistItem::new("1", "Is the answer polite?")],
            ..Checklist::default()
        },
        targets: vec![ScoreTarget {
            id: "t".into(),
            input: "Say hi".into(),
            target: "Hello!".into(),
            ..Default::default()
        }],
        model: spec(),
        ..ScoreRequest::default()
    };
    let outcome = core(&llm).await.score(request, &|_| {}).await.unwrap();
    assert_eq!(outcome.model.max_tokens, MAX_TOKENS as u32, "the record names the limit sent");
    assert_spec_reached_backend(&llm);
}

#[tokio::test]
async fn the_judge_panel_sends_the_callers_top_p_and_max_tokens() {
    let llm = ScriptedLlm::start().await;
    llm.set_handler(|_| Reply::json(json!({"criterion_scores": {}, "issues": [], "section_scores": []})));
    let request = JudgeSectionsRequest {
        sections: vec![Section { id: "s1".into(), index: 0, title: "Intro".into(), content: "Some text.".into() }],
        criteria: default_criteria(),
        judges: vec![PanelJudge { id: "j1".into(), model: spec() }],
        ..JudgeSectionsRequest::default()
    };
    core(&llm).await.judge_sections(request, &|_| {}).await.unwrap();
    assert_spec_reached_backend(&llm);
}
