//! A caller's `top_p` and `max_tokens` reach the backend from the refiners' calls (requests recorded
//! by the scripted OpenAI-compatible backend): every refiner builds its request with the same
//! helper, so the patcher's call stands for them.

use std::sync::Arc;

use assay_domain::content::{ContentRefiner, SectionEditRequest};
use assay_domain::{ModelSpec, Section};
use assay_llm::{ModelHub, OpenAiConfig};
use assay_refiners::ChecklistRefiners;
use assay_testkit::{Reply, ScriptedLlm};

const TOP_P: f64 = 0.5;
const MAX_TOKENS: u64 = 777;

#[tokio::test]
async fn the_patcher_sends_the_callers_top_p_and_max_tokens() {
    let llm = ScriptedLlm::start().await;
    llm.set_handler(|_| Reply::text("<section>The function returns the file's text as a string.</section>"));
    let mut cfg = OpenAiConfig::new(llm.base_url());
    cfg.max_retries = 0;
    let core = ChecklistRefiners::new(Arc::new(ModelHub::single_openai(cfg).unwrap()));
    let request = SectionEditRequest {
        section: Section {
            id: "s1".into(),
            index: 0,
            title: "Intro".into(),
            content: "The function reads a file and gives you something back.".into(),
        },
        instruction: "Say what the function returns.".into(),
        model: ModelSpec { top_p: Some(TOP_P), max_tokens: Some(MAX_TOKENS as u32), ..ModelSpec::default() },
        ..SectionEditRequest::default()
    };
    let edit = core.patch(request).await.unwrap();
    assert_eq!(edit.model.max_tokens, MAX_TOKENS as u32, "the record names the limit sent");
    let chats: Vec<_> = llm.requests().into_iter().filter(|r| r.is_chat()).collect();
    assert_eq!(chats.len(), 1);
    for r in chats {
        assert_eq!(r.body["top_p"].as_f64(), Some(TOP_P), "top_p: {}", r.body);
        let limit = r.body.get("max_tokens").or_else(|| r.body.get("max_completion_tokens"));
        assert_eq!(limit.and_then(|v| v.as_u64()), Some(MAX_TOKENS), "max tokens: {}", r.body);
    }
}
