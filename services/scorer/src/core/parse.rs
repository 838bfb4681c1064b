//! Reply schemas and lenient parsing of scorer replies.

use assay_domain::{Answer, Checklist, ItemScore, ItemStatus, UnusableReply};
use assay_llm::ChatResponse;
use assay_llm::json::reply_json;
use serde_json::{Value, json};

/// Schema of a batch reply to `questions` questions: one answer per question (`minItems` =
/// `maxItems`; a backend that enforces the schema by grammar, as llama.cpp servers do, then cannot
/// stop after two answers), each index from 1 to `questions`.
pub fn batch_schema(reasoning: bool, questions: usize) -> Value {
    let mut props = json!({
        "question_index": {"type": "integer", "minimum": 1, "maximum": questions},
        "answer": {"type": "string", "enum": ["YES", "NO"]}
    });
    let mut required = vec!["question_index", "answer"];
    if reasoning {
        props["reasoning"] = json!({"type": "string"});
        required.insert(1, "reasoning");
    }
    json!({
        "type": "object",
        "properties": {
            "answers": {
                "type": "array",
                "minItems": questions,
                "maxItems": questions,
                "items": {"type": "object", "properties": props, "required": required, "additionalProperties": false}
            }
        },
        "required": ["answers"],
        "additionalProperties": false
    })
}

/// Schema of an item reply.
pub fn item_schema(reasoning: bool) -> Value {
    if reasoning {
        json!({
            "type": "object",
            "properties": {"reasoning": {"type": "string"}, "answer": {"type": "string", "enum": ["YES", "NO"]}},
            "required": ["reasoning", "answer"],
            "additionalProperties": false
        })
    } else {
        json!({
            "type": "object",
            "properties": {"answer": {"type": "string", "enum": ["YES", "NO"]}},
            "required": ["answer"],
            "additionalProperties": false
        })
    }
}

/// One entry of a batch reply: a 1-based question index and the raw answer text.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchAnswer {
    pub index: i64,
    pub answer: String,
    pub reasoning: Option<String>,
}

fn index_of(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64)),
        Value::String(s) => s.trim().trim_start_matches(['Q', 'q']).parse().ok(),
        Value::Null | Value::Bool(_) | Value::Array(_) | Value::Object(_) => None,
    }
}

/// Entries of a batch reply: `{"answers": [{"question_index": i, "answer": "YES"}]}`; also accepts
/// `index`/`question`/`id` as the index key, a bare array, and `{"Q1": "YES", ...}` maps.
pub fn parse_batch_reply(reply: &ChatResponse) -> Result<Vec<BatchAnswer>, UnusableReply> {
    let v = reply_json(reply).ok_or_else(|| UnusableReply::from("the reply holds no JSON value"))?;
    let list = match &v {
        Value::Object(o) => match o.get("answers") {
            Some(Value::Array(a)) => a.clone(),
            Some(Value::Object(m)) => m.iter().map(|(k, a)| json!({"question_index": k, "answer": a})).collect(),
            _ => o
                .iter()
                .filter(|(k, _)| k.trim_start_matches(['Q', 'q']).parse::<i64>().is_ok())
                .map(|(k, a)| json!({"question_index": k, "answer": a}))
                .collect(),
        },
        Value::Array(a) => a.clone(),
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => Vec::new(),
    };
    if list.is_empty() {
        return Err("the reply's JSON has no answers".into());
    }
    let mut out = Vec::with_capacity(list.len());
    for entry in list {
        let Value::Object(o) = entry else { continue };
        let Some(index) =
            ["question_index", "index", "question", "id", "q"].iter().find_map(|k| o.get(*k).and_then(index_of))
        else {
            continue;
        };
        let answer = match o.get("answer") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Bool(b)) => if *b { "YES" } else { "NO" }.to_string(),
            Some(other) => other.to_string(),
            None => String::new(),
        };
        let reasoning = o.get("reasoning").and_then(Value::as_str).map(str::to_string);
        out.push(BatchAnswer { index, answer, reasoning });
    }
    Ok(out)
}

/// Map batch entries onto the checklist: a duplicate index -> last wins; a missing index ->
/// unanswered; an out-of-range index is ignored; answers are case-insensitive YES/NO, anything else
/// marks the item unparseable.
pub fn map_batch_answers(checklist: &Checklist, answers: &[BatchAnswer]) -> Vec<ItemScore> {
    let n = checklist.items.len() as i64;
    let mut slots: Vec<Option<&BatchAnswer>> = vec![None; checklist.items.len()];
    for a in answers {
        if (1..=n).contains(&a.index) {
            slots[(a.index - 1) as usize] = Some(a);
        }
    }
    checklist
        .items
        .iter()
        .zip(slots)
        .map(|(item, slot)| match slot {
            None => ItemScore::missing(&item.id, ItemStatus::Unanswered, "the reply has no answer for this question"),
            Some(a) => match Answer::parse(&a.answer) {
                Some(ans) => {
                    let mut s = ItemScore::answered(&item.id, ans);
                    s.reasoning = a.reasoning.clone();
                    s
                }
                None => ItemScore::missing(
                    &item.id,
                    ItemStatus::Unparseable,
                    format!("answer {:?} is not yes or no", a.answer),
                ),
            },
        })
        .collect()
}

/// An item reply: JSON `{"answer": "YES", "reasoning": "..."}`, else a bare YES/NO first word.
pub fn parse_item_reply(item_id: &str, reply: &ChatResponse) -> ItemScore {
    if let Some(Value::Object(o)) = reply_json(reply)
        && let Some(ans) = o.get("answer").and_then(Value::as_str).and_then(Answer::parse)
    {
        let mut s = ItemScore::answered(item_id, ans);
        s.reasoning = o.get("reasoning").and_then(Value::as_str).map(str::to_string);
        return s;
    }
    let first = reply.text.split_whitespace().next().unwrap_or("");
    match Answer::parse(first) {
        Some(ans) => {
            let mut s = ItemScore::answered(item_id, ans);
            let rest = reply.text.trim()[first.len()..].trim();
            if !rest.is_empty() {
                s.reasoning = Some(rest.to_string());
            }
            s
        }
        None => ItemScore::missing(item_id, ItemStatus::Unparseable, "the reply holds no yes/no answer"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use assay_domain::ChecklistItem;

    fn cl(n: usize) -> Checklist {
        Checklist {
            items: (1..=n).map(|i| ChecklistItem::new(format!("i{i}"), format!("q{i}"))).collect(),
            ..Default::default()
        }
    }

    fn reply(text: &str) -> ChatResponse {
        ChatResponse { text: text.into(), ..Default::default() }
    }

    #[test]
    fn mapping_rules() {
        let r = reply(
            r#"```json
{"answers": [{"question_index": 1, "answer": "NO"}, {"question_index": 1, "answer": "yes"},
 {"question_index": 3, "answer": "No"}, {"question_index": 9, "answer": "YES"}, {"question_index": 4, "answer": "perhaps"}]}
```"#,
        );
        let answers = parse_batch_reply(&r).unwrap();
        let items = map_batch_answers(&cl(4), &answers);
        assert_eq!(items[0].answer, Some(Answer::Yes), "last duplicate wins, lower-case accepted");
        assert_eq!(items[1].status, ItemStatus::Unanswered);
        assert_eq!(items[2].answer, Some(Answer::No));
        assert_eq!(items[3].status, ItemStatus::Unparseable);
    }

    #[test]
    fn prose_around_json_and_map_form() {
        let r = reply(r#"Sure! {"Q1": "YES", "Q2": "NO"} hope that helps"#);
        let items = map_batch_answers(&cl(2), &parse_batch_reply(&r).unwrap());
        assert_eq!(items[0].answer, Some(Answer::Yes));
        assert_eq!(items[1].answer, Some(Answer::No));
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(parse_batch_reply(&reply("I cannot do that")).is_err());
    }

    #[test]
    fn item_reply_forms() {
        assert_eq!(parse_item_reply("a", &reply(r#"{"answer":"no","reasoning":"r"}"#)).reasoning.as_deref(), Some("r"));
        assert_eq!(parse_item_reply("a", &reply("YES. It does.")).answer, Some(Answer::Yes));
        assert_eq!(parse_item_reply("a", &reply("unclear")).status, ItemStatus::Unparseable);
    }
}
