//! A caller's `top_p` and `max_tokens` reach the backend from the generator's calls: the checklist
//! call and the candidate calls (requests recorded by the scripted OpenAI-compatible backend).

use std::sync::Arc;

use assay_domain::ModelSpec;
use assay_domain::generator::{GenerateRequest, Preset};
use assay_generator::Generator;
use assay_llm::{ModelHub, OpenAiConfig};
use assay_testkit::{Reply, ScriptedLlm};
use serde_json::json;

const TOP_P: f64 = 0.5;

fn spec(max_tokens: u32) -> ModelSpec {
    ModelSpec { top_p: Some(TOP_P), max_tokens: Some(max_tokens), ..ModelSpec::default() }
}

#[tokio::test]
async fn checklist_and_candidate_calls_send_the_callers_top_p_and_max_tokens() {
    let llm = ScriptedLlm::start().await;
    // The checklist call asks for JSON; candidate calls for free text.
    llm.set_handler(|r| {
        if r.body.get("response_format").is_some() {
            Reply::json(json!({"items": [{"question": "Does the reply greet the user?"}]}))
        } else {
            Reply::text("Hello there!")
        }
    });
    let mut cfg = OpenAiConfig::new(llm.base_url());
    cfg.max_retries = 0;
    let generator = Generator::new(Arc::new(ModelHub::single_openai(cfg).unwrap()));
    let mut request = GenerateRequest::new(Preset::RlcfCandidatesOnly, "Say hello to the user.");
    request.model = spec(777);
    request.candidate_models = vec![spec(333)];
    let outcome = generator.generate(request).await.unwrap();
    assert_eq!(outcome.model.max_tokens, 777, "the record names the limit sent");
    let chats: Vec<_> = llm.requests().into_iter().filter(|r| r.is_chat()).collect();
    let limit = |r: &assay_testkit::RecordedRequest| {
        r.body.get("max_tokens").or_else(|| r.body.get("max_completion_tokens")).and_then(|v| v.as_u64())
    };
    let (checklist, candidates): (Vec<_>, Vec<_>) = chats.iter().partition(|r| r.body.get("response_format").is_some());
    assert_eq!((checklist.len(), candidates.len()), (1, 4), "one checklist call after 4 candidate draws");
    for r in &chats {
        assert_eq!(r.body["top_p"].as_f64(), Some(TOP_P), "top_p: {}", r.body);
    }
    assert_eq!(limit(checklist[0]), Some(777), "checklist call: {}", checklist[0].body);
    for r in candidates {
        assert_eq!(limit(r), Some(333), "candidate call: {}", r.body);
    }
}
