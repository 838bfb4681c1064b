//! Lenient reading of corpus-stage replies: the structured JSON the schema asks for, and the
//! shapes models produce without it (bare arrays, other list keys, plain strings, maps).

use serde_json::{Map, Value};

pub use assay_llm::json::find_list;

use crate::core::parse::clean_question;

/// Keys holding the text of one question entry.
const TEXT_KEYS: &[&str] = &["question", "text", "name", "component", "criterion", "item"];

/// The text of an entry: the string itself, or the first of the usual text keys of an object.
pub fn text_of(entry: &Value) -> Option<String> {
    let raw = match entry {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => text_in(o),
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::Array(_) => None,
    }?;
    let q = clean_question(&raw);
    (!q.is_empty()).then_some(q)
}

fn text_in(o: &Map<String, Value>) -> Option<String> {
    TEXT_KEYS
        .iter()
        .find_map(|k| o.get(*k).and_then(Value::as_str))
        .or_else(|| o.values().find_map(Value::as_str))
        .map(str::to_string)
}

/// Cleaned, non-empty strings of a list found under `keys` (entries may be strings or objects).
pub fn strings(v: &Value, keys: &[&str]) -> Option<Vec<String>> {
    find_list(v, keys).map(|l| l.iter().filter_map(text_of).collect())
}

/// A string field of an object entry.
pub fn str_field(entry: &Value, keys: &[&str]) -> Option<String> {
    let o = entry.as_object()?;
    keys.iter().find_map(|k| o.get(*k).and_then(Value::as_str)).map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

/// An integer the model wrote: a number or a numeric string (`"12"`, `"[12]"`, `"#12"`).
/// `None` for anything else (fractions, words); negative numbers are returned as such.
pub fn integer_of(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64)),
        Value::String(s) => s.trim().trim_matches(['[', ']', '#']).trim().parse().ok(),
        Value::Null | Value::Bool(_) | Value::Array(_) | Value::Object(_) => None,
    }
}

/// Entries keyed by name: `[{"component": k, <value_key>: v}]` or `{k: v}`. Keys are trimmed.
pub fn keyed_entries<'a>(
    v: &'a Value,
    list_keys: &[&str],
    key_keys: &[&str],
    value_keys: &[&str],
) -> Vec<(String, &'a Value)> {
    if let Some(list) = find_list(v, list_keys)
        && list.iter().any(Value::is_object)
    {
        return list
            .iter()
            .filter_map(|e| {
                let key = str_field(e, key_keys)?;
                let o = e.as_object()?;
                let value = value_keys.iter().find_map(|k| o.get(*k))?;
                Some((key, value))
            })
            .collect();
    }
    // A map; unwrap one level when the model nested it under a list key (`{"clusters": {...}}`).
    let map = match v {
        Value::Object(o) => list_keys.iter().find_map(|k| o.get(*k).and_then(Value::as_object)).unwrap_or(o),
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) | Value::Array(_) => return Vec::new(),
    };
    map.iter().map(|(k, v)| (k.trim().to_string(), v)).filter(|(k, _)| !k.is_empty()).collect()
}

/// Case- and space-insensitive name comparison.
pub fn same_name(a: &str, b: &str) -> bool {
    let norm = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase();
    norm(a) == norm(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lists_and_texts_are_found_leniently() {
        let v = json!({"questions": ["- Is it clear?", {"question": " Is it short? "}, "", 3]});
        assert_eq!(strings(&v, &["questions"]).unwrap(), vec!["Is it clear?", "Is it short?"]);
        assert_eq!(strings(&json!(["a?"]), &["x"]).unwrap(), vec!["a?"]);
        assert_eq!(strings(&json!({"other": ["b?"]}), &["x"]).unwrap(), vec!["b?"]);
        assert!(strings(&json!({"x": 1}), &["x"]).is_none());
    }

    #[test]
    fn integers_are_read_from_numbers_and_strings() {
        assert_eq!(integer_of(&json!(12)), Some(12));
        assert_eq!(integer_of(&json!(3.0)), Some(3));
        assert_eq!(integer_of(&json!("[7]")), Some(7));
        assert_eq!(integer_of(&json!(-2)), Some(-2));
        assert_eq!(integer_of(&json!(1.5)), None);
        assert_eq!(integer_of(&json!("seven")), None);
    }

    #[test]
    fn keyed_entries_accept_lists_and_maps() {
        let list =
            json!({"clusters": [{"component": "Flow", "attributes": ["a"]}, {"component": "Tone", "attributes": []}]});
        let got: Vec<String> =
            keyed_entries(&list, &["clusters"], &["component"], &["attributes"]).into_iter().map(|(k, _)| k).collect();
        assert_eq!(got, vec!["Flow", "Tone"]);
        let map = json!({"clusters": {"Flow": ["a"], "Tone": ["b"]}});
        assert_eq!(keyed_entries(&map, &["clusters"], &["component"], &["attributes"]).len(), 2);
        let bare = json!({"Flow": ["a"]});
        assert_eq!(keyed_entries(&bare, &["clusters"], &["component"], &["attributes"])[0].0, "Flow");
        assert!(same_name(" Logical  flow", "logical flow"));
    }
}
