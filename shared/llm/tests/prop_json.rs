//! Property tests of the JSON repair (`assay_llm::json`): it never panics on any text, and a valid
//! JSON value comes back unchanged from a reply that wraps it: as it is, in prose, in a code fence,
//! with trailing commas, or cut short inside a list (the list's complete elements kept).

use assay_llm::json::{extract_json, repair_truncated};
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// Strings of any characters but the backtick: in a reply that is not JSON as a whole, the repair
/// takes ``` inside a string value for the reply's code fence.
fn string() -> impl Strategy<Value = String> {
    prop_oneof![3 => "[a-z ]{0,12}", 1 => "[^`]{0,16}"]
}

fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        // Binary fractions: exact in text and back.
        (-1_000_000i64..1_000_000).prop_map(|n| json!(n as f64 / 8.0)),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number(),
        string().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 5, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..5).prop_map(Value::Array),
            btree_map(string(), inner, 0..5).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// An object or a list: what a reply in prose can carry.
fn container() -> impl Strategy<Value = Value> {
    value().prop_filter("an object or a list", |v| v.is_object() || v.is_array())
}

/// Text around a value: no brackets, braces, quotes or backticks.
fn prose() -> impl Strategy<Value = String> {
    "[A-Za-z0-9 ,.:;!?'\n-]{0,40}"
}

fn serialise(v: &Value, pretty: bool) -> String {
    if pretty { serde_json::to_string_pretty(v).unwrap() } else { serde_json::to_string(v).unwrap() }
}

/// `v` serialised with a comma after the last entry of every non-empty object and list.
fn trailing_commas(v: &Value) -> String {
    match v {
        Value::Array(items) if !items.is_empty() => {
            let inner: Vec<String> = items.iter().map(trailing_commas).collect();
            format!("[{},]", inner.join(", "))
        }
        Value::Object(m) if !m.is_empty() => {
            let inner: Vec<String> = m
                .iter()
                .map(|(k, x)| format!("{}: {}", serde_json::to_string(k).unwrap(), trailing_commas(x)))
                .collect();
            format!("{{{},\n}}", inner.join(", "))
        }
        Value::Array(_) | Value::Object(_) | Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => {
            serde_json::to_string(v).unwrap()
        }
    }
}

/// A flat object (no nested list or object): the element a reply was cut inside.
fn flat_object() -> impl Strategy<Value = Value> {
    btree_map("[a-z]{1,6}", prop_oneof![string().prop_map(Value::String), number()], 1..4)
        .prop_map(|m| Value::Object(m.into_iter().collect::<Map<String, Value>>()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn never_panics_on_any_text(text in any::<String>()) {
        let _ = extract_json(&text);
        let _ = repair_truncated(&text);
    }

    #[test]
    fn never_panics_on_json_like_text(text in r#"[{}\[\]",:\\ `a-c0-9\n\t.eE+-]{0,80}"#) {
        let _ = extract_json(&text);
        let _ = repair_truncated(&text);
    }

    #[test]
    fn never_panics_on_json_cut_anywhere(v in value(), at in any::<prop::sample::Index>(), pretty in any::<bool>()) {
        let text = serialise(&v, pretty);
        let cuts: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
        let cut = &text[..cuts[at.index(cuts.len())]];
        let _ = extract_json(cut);
        let _ = repair_truncated(cut);
    }

    #[test]
    fn a_whole_value_comes_back(v in value(), pretty in any::<bool>(), pad in "[ \n\t]{0,3}") {
        prop_assert_eq!(extract_json(&format!("{pad}{}{pad}", serialise(&v, pretty))), Some(v));
    }

    #[test]
    fn a_value_in_prose_comes_back(v in container(), before in prose(), after in prose(), pretty in any::<bool>()) {
        let text = format!("{before}{}{after}", serialise(&v, pretty));
        prop_assert_eq!(extract_json(&text), Some(v));
    }

    /// Fences: ```json, ```JSON or bare ``` on a line of their own, or the value on the fence's
    /// line (```{"a": 1}```); any value, scalars too.
    #[test]
    fn a_fenced_value_comes_back(
        v in value(),
        before in prose(),
        after in prose(),
        fence in prop_oneof![Just("json\n"), Just("\n"), Just("JSON\n"), Just("")],
        pretty in any::<bool>(),
    ) {
        let text = if fence.is_empty() {
            format!("{before}```{}```{after}", serialise(&v, false))
        } else {
            format!("{before}```{fence}{}\n```{after}", serialise(&v, pretty))
        };
        prop_assert_eq!(extract_json(&text), Some(v));
    }

    #[test]
    fn trailing_commas_are_forgiven(v in container(), before in prose(), after in prose()) {
        let text = format!("{before}{}{after}", trailing_commas(&v));
        prop_assert_eq!(extract_json(&text), Some(v));
    }

    /// A reply cut short inside the last element of a list (the token limit reached) keeps the
    /// complete elements: `{"items": [a, b, {"q": "c` -> `{"items": [a, b]}`. Elements before the
    /// cut are any objects; a top-level list is cut after two of them at least (cut after one, the
    /// span of that one object is taken for the reply).
    #[test]
    fn a_reply_cut_inside_a_list_keeps_the_complete_elements(
        complete in vec(btree_map(string(), value(), 0..4), 1..5),
        last in flat_object(),
        key in "[a-z_]{1,10}",
        top_level_list in any::<bool>(),
        at in any::<prop::sample::Index>(),
        before in prose(),
    ) {
        let complete: Vec<Value> = complete.into_iter().map(|m| Value::Object(m.into_iter().collect())).collect();
        prop_assume!(!top_level_list || complete.len() >= 2);
        let last = serde_json::to_string(&last).unwrap();
        // Cut after the opening brace and before the closing one, on a character boundary.
        let cuts: Vec<usize> = last.char_indices().map(|(i, _)| i).filter(|i| *i >= 1).collect();
        let cut = &last[..cuts[at.index(cuts.len())]];
        let elements: Vec<String> = complete.iter().map(|e| serde_json::to_string(e).unwrap()).collect();
        let list = format!("[{}, {cut}", elements.join(", "));
        let (text, expected) = if top_level_list {
            (format!("{before}{list}"), Value::Array(complete))
        } else {
            (format!("{before}{{\"{key}\": {list}"), json!({ key: complete }))
        };
        prop_assert_eq!(extract_json(&text), Some(expected));
    }
}
