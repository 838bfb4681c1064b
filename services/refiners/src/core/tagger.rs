//! Tagger: one model call per item (concurrent, bounded) judging two criteria, generally
//! applicable and section specific; an item is kept iff both hold. A reply that cannot be parsed
//! (or a call that failed after its retries) is an error for that item: reported, never a silent
//! drop.

use assay_domain::template::render;
use assay_domain::{ChecklistItem, StageError, UnusableReply, Usage};
use assay_llm::json::{lenient_bool, preview, reply_json};
use assay_llm::{ChatResponse, ResponseFormat};
use futures::StreamExt;
use serde_json::{Value, json};

use super::base::{ChecklistRefiners, ItemFailure, TAG_TEMPLATE, chat_request};
use assay_domain::refiners::{ActionKind, ItemTag, RefinerAction, StepOutcome, TagOptions, names};

/// Max tokens of a tagging reply unless configured.
const TAG_MAX_TOKENS: u32 = 512;
/// Longest reasoning the schema allows (characters), so a constrained model finishes its JSON.
const MAX_REASONING_CHARS: u32 = 800;

fn tag_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "reasoning": {"type": "string", "maxLength": MAX_REASONING_CHARS},
            "generally_applicable": {"type": "boolean"},
            "section_specific": {"type": "boolean"}
        },
        "required": ["reasoning", "generally_applicable", "section_specific"],
        "additionalProperties": false
    })
}

/// (generally_applicable, section_specific, reasoning) of a reply, or why it cannot be read.
pub(crate) fn parse_tag(reply: &ChatResponse) -> Result<(bool, bool, String), UnusableReply> {
    let value = reply_json(reply).ok_or_else(|| {
        UnusableReply::from(format!("the reply holds no JSON (reply starts with {:?})", preview(&reply.text, 80)))
    })?;
    let Value::Object(map) = value else {
        return Err("the reply's JSON is not an object".into());
    };
    let flag = |key: &str| {
        map.get(key)
            .and_then(lenient_bool)
            .ok_or_else(|| UnusableReply::from(format!("the reply has no boolean {key:?}")))
    };
    let ga = flag("generally_applicable")?;
    let ss = flag("section_specific")?;
    let reasoning = map.get("reasoning").and_then(Value::as_str).unwrap_or_default().trim().to_string();
    Ok((ga, ss, reasoning))
}

pub(super) async fn run(
    core: &ChecklistRefiners,
    items: Vec<ChecklistItem>,
    options: &TagOptions,
) -> Result<StepOutcome, StageError> {
    let chat = core.chat(&options.model, "model")?;
    let concurrency = core.effective_concurrency(options.concurrency);
    let (chat, items_ref) = (&chat, &items);
    let replies: Vec<_> = futures::stream::iter(0..items.len())
        .map(|i| async move {
            let it = &items_ref[i];
            let prompt = render(TAG_TEMPLATE, &[("question", it.question.trim())]);
            let req = chat_request(
                chat,
                prompt,
                ResponseFormat::JsonSchema { name: "question_tags".into(), schema: tag_schema() },
                TAG_MAX_TOKENS,
            );
            chat.model.chat(req).await
        })
        .buffered(concurrency)
        .collect()
        .await;

    let mut usage = Usage::default();
    let mut out = Vec::new();
    let mut tags = Vec::with_capacity(items.len());
    let mut actions = Vec::with_capacity(items.len());
    let mut parse_failures = 0u32;
    for (it, reply) in items.into_iter().zip(replies) {
        let parsed = match reply {
            Ok(r) => {
                usage.add(&r.usage);
                parse_tag(&r).map_err(|why| ItemFailure::Unparsed { step: "tagging", why })
            }
            // Transient failures already exhausted their retries: an error for this item only.
            Err(e) if e.is_transient() => Err(ItemFailure::Call { step: "tagging", error: e }),
            Err(e) => return Err(e.into()),
        };
        match parsed {
            Ok((ga, ss, reasoning)) => {
                let kept = ga && ss;
                let reason = match (ga, ss) {
                    (true, true) => "generally applicable and section specific".to_string(),
                    (false, true) => "not generally applicable (some responses would make it N/A)".to_string(),
                    (true, false) => "not section specific (several aspects or depends on others)".to_string(),
                    (false, false) => "neither generally applicable nor section specific".to_string(),
                };
                let reason =
                    if reasoning.is_empty() { reason } else { format!("{reason}: {}", preview(&reasoning, 200)) };
                actions.push(RefinerAction::new(
                    names::TAGGER,
                    &it.id,
                    if kept { ActionKind::Kept } else { ActionKind::Removed },
                    reason,
                ));
                tags.push(ItemTag {
                    item_id: it.id.clone(),
                    generally_applicable: ga,
                    section_specific: ss,
                    reasoning: reasoning.clone(),
                    error: None,
                });
                if kept {
                    let mut it = it;
                    it.metadata.insert("generally_applicable".into(), "true".into());
                    it.metadata.insert("section_specific".into(), "true".into());
                    it.metadata.insert("tag_reasoning".into(), reasoning);
                    out.push(it);
                }
            }
            Err(why) => {
                parse_failures += 1;
                actions.push(RefinerAction::new(
                    names::TAGGER,
                    &it.id,
                    ActionKind::Error,
                    format!("{why}; the item is not kept"),
                ));
                tags.push(ItemTag { item_id: it.id.clone(), error: Some(why.to_string()), ..Default::default() });
            }
        }
    }
    tracing::debug!(items = tags.len(), kept = out.len(), parse_failures, "tagged");
    Ok(StepOutcome { items: out, actions, usage, tags, parse_failures, ..Default::default() })
}
