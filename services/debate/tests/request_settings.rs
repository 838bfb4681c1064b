//! A caller's `top_p` and `max_tokens` reach the backend from debate calls (requests recorded by
//! the scripted OpenAI-compatible backend). Every phase (solve, review, refine, judge) builds its
//! request through the same job, so the solvers' calls stand for all of them.

use std::sync::Arc;

use assay_debate::DebateCore;
use assay_domain::ModelSpec;
use assay_domain::debate::{Debate, SolveRequest, Solver};
use assay_llm::{ModelHub, OpenAiConfig};
use assay_testkit::{Reply, ScriptedLlm};
use serde_json::json;

const TOP_P: f64 = 0.5;
const MAX_TOKENS: u64 = 777;

fn spec() -> ModelSpec {
    ModelSpec { top_p: Some(TOP_P), max_tokens: Some(MAX_TOKENS as u32), ..ModelSpec::default() }
}

fn core(llm: &ScriptedLlm) -> DebateCore {
    let mut cfg = OpenAiConfig::new(llm.base_url());
    cfg.max_retries = 0;
    DebateCore::new(Arc::new(ModelHub::single_openai(cfg).unwrap()))
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
async fn a_solver_sends_the_callers_top_p_and_max_tokens() {
    let llm = ScriptedLlm::start().await;
    llm.set_handler(|_| {
        Reply::json(
            json!({"approach": "add", "reasoning_steps": ["2 + 2 = 4"], "final_answer": "4", "confidence": 0.9}),
        )
    });
    let request = SolveRequest {
        problem: "What is 2 + 2?".into(),
        solvers: ["s1", "s2", "s3"]
            .map(|id| Solver { id: id.into(), persona: "a careful solver".into(), model: spec() })
            .to_vec(),
    };
    let outcome = core(&llm).solve(request).await.unwrap();
    for solution in &outcome.solutions {
        let record = solution.model.as_ref().expect("a solution names its model");
        assert_eq!(record.max_tokens, MAX_TOKENS as u32, "the record names the limit sent");
    }
    assert_spec_reached_backend(&llm);
}
