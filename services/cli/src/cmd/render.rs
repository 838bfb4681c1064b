//! JSON renderings of checklists, record results and self-refine hook entries, as the commands
//! print them.

use assay_proto::common::v1 as common;
use assay_proto::gateway::v1 as gw;
use serde_json::{Value, json};

/// A checklist as JSON (the shape [`checklist_from_json`](super::input::checklist_from_json) reads back).
pub fn checklist_json(c: &common::Checklist) -> Value {
    let items: Vec<Value> = c
        .items
        .iter()
        .map(|i| {
            let mut item = json!({"id": i.id, "question": i.question, "weight": i.weight.unwrap_or(100.0)});
            if !i.category.is_empty() {
                item["category"] = json!(i.category);
            }
            if !i.merged_from.is_empty() {
                item["merged_from"] = json!(i.merged_from);
            }
            if !i.source_indices.is_empty() {
                item["source_indices"] = json!(i.source_indices);
            }
            if !i.metadata.is_empty() {
                item["metadata"] = json!(i.metadata);
            }
            item
        })
        .collect();
    let level = common::GenerationLevel::try_from(c.generation_level)
        .map_or("unspecified", |l| l.as_str_name())
        .trim_start_matches("GENERATION_LEVEL_")
        .to_lowercase();
    json!({
        "id": c.id, "source_method": c.source_method, "generation_level": level, "input": c.input,
        "corpus_description": c.corpus_description, "items": items,
    })
}

/// One record's result as a JSON line.
pub fn record_json(r: &gw::RecordResult) -> Value {
    let answers: serde_json::Map<String, Value> = r
        .score
        .iter()
        .flat_map(|s| s.item_scores.iter())
        .map(|i| {
            let a = match common::Answer::try_from(i.answer) {
                Ok(common::Answer::Yes) => json!("yes"),
                Ok(common::Answer::No) => json!("no"),
                Ok(common::Answer::Unspecified) | Err(_) => Value::Null,
            };
            (i.item_id.clone(), a)
        })
        .collect();
    json!({
        "index": r.index,
        "id": r.record_id,
        "checklist_id": r.checklist_id,
        "error": if r.error.is_empty() { Value::Null } else { r.error.clone().into() },
        "pass_rate": r.score.as_ref().map(|s| s.pass_rate),
        "weighted_score": r.score.as_ref().map(|s| s.weighted_score),
        "normalized_score": r.score.as_ref().map(|s| s.normalized_score),
        "primary_score": r.score.as_ref().map(|s| s.primary_score),
        "unanswered": r.score.as_ref().map(|s| s.unanswered_count),
        "answers": answers,
    })
}

/// One output through the self-refine hook as JSON: what it was, who wrote it, the text before and
/// after, and why it was skipped, how the loop went (its passes) or why it failed.
pub fn self_refined_json(e: &gw::SelfRefined) -> Value {
    let mut v = json!({
        "target": e.target, "producer": e.producer, "changed": e.before != e.after,
        "before": e.before, "after": e.after,
    });
    if !e.skipped.is_empty() {
        v["skipped"] = json!(e.skipped);
    }
    if let Some(r) = &e.refine {
        v["refine"] = super::refine_text::self_refine_result_json(r);
    }
    if !e.error.is_empty() {
        v["error"] = json!(e.error);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::super::input::checklist_from_json;
    use super::*;

    #[test]
    fn checklist_round_trips_through_json() {
        let v = json!({"id": "c1", "items": ["Is it short?", {"id": "x", "question": "Is it kind?", "weight": 40, "category": "tone"}]});
        let c = checklist_from_json(&v).unwrap();
        assert_eq!(c.items[0].id, "q1");
        assert_eq!(c.items[1].weight, Some(40.0));
        let back = checklist_from_json(&checklist_json(&c)).unwrap();
        // An unset weight is written as the default 100.
        assert_eq!(back.items[0].weight, Some(100.0));
        assert_eq!(back.items[1], c.items[1]);
        assert_eq!((back.items[0].id.as_str(), back.items[0].question.as_str()), ("q1", "Is it short?"));
        assert!(checklist_from_json(&json!({"items": [{"id": "a"}]})).unwrap_err().contains("items[0]"));
    }

    #[test]
    fn self_refined_entries_say_what_the_hook_did() {
        let refined = gw::SelfRefined {
            target: "intro".into(),
            producer: "model".into(),
            before: "Old.".into(),
            after: "New.".into(),
            refine: Some(assay_proto::refiners::v1::SelfRefineResponse {
                final_text: "New.".into(),
                passes: vec![assay_proto::refiners::v1::SelfRefinePass { pass: 1, ..Default::default() }],
                changed: true,
                ..Default::default()
            }),
            ..Default::default()
        };
        let v = self_refined_json(&refined);
        assert_eq!((v["target"].as_str(), v["producer"].as_str()), (Some("intro"), Some("model")));
        assert_eq!(
            (v["before"].as_str(), v["after"].as_str(), v["changed"].as_bool()),
            (Some("Old."), Some("New."), Some(true))
        );
        assert_eq!(v["refine"]["passes"][0]["pass"], 1);
        assert!(v.get("skipped").is_none() && v.get("error").is_none());
        let skipped = gw::SelfRefined {
            target: "a".into(),
            producer: "debate".into(),
            skipped: "too_short".into(),
            before: "4".into(),
            after: "4".into(),
            ..Default::default()
        };
        let v = self_refined_json(&skipped);
        assert_eq!((v["skipped"].as_str(), v["changed"].as_bool()), (Some("too_short"), Some(false)));
        assert!(v.get("refine").is_none());
        let failed = gw::SelfRefined { skipped: String::new(), error: "refiner down".into(), ..skipped };
        let v = self_refined_json(&failed);
        assert_eq!(v["error"], "refiner down");
        assert!(v.get("skipped").is_none());
    }
}
