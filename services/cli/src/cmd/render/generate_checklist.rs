//! What `assay generate` prints: one line per checklist, in the checklist file format that
//! `--checklist` reads back ([`checklist_from_json`](crate::cmd::input::checklist_from_json)), with
//! the run and the index of the generation; or the generation's error.

use assay_proto::common::v1 as common;
use serde_json::{Value, json};

/// A checklist in the checklist file format (the shape `--checklist` reads back).
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

/// The line of a generated checklist: the checklist with its run and index.
pub fn checklist_line(run_id: &str, index: usize, c: &common::Checklist) -> Value {
    let mut v = checklist_json(c);
    v["run_id"] = run_id.into();
    v["index"] = index.into();
    v
}

/// The line of a failed generation.
pub fn failure_line(run_id: &str, index: usize, error: &str) -> Value {
    json!({"run_id": run_id, "index": index, "error": error})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::input::checklist_from_json;

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
}
