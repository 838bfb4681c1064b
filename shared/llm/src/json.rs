//! Lenient reading of model replies: pulling a JSON value out of model text ([`extract_json`],
//! [`reply_json`]), booleans as models write them ([`lenient_bool`]) and short quotes of a reply for
//! error messages ([`preview`]). Every stage reads replies through these.

use serde_json::Value;

use crate::types::ChatResponse;

/// The JSON value of a reply: the structured value when the backend gave one, else the JSON found
/// in the text ([`extract_json`]).
pub fn reply_json(reply: &ChatResponse) -> Option<Value> {
    reply.json.clone().or_else(|| extract_json(&reply.text))
}

/// A boolean as models write it: `true`/`false`, or the strings true/false/yes/no (any case,
/// surrounding spaces ignored).
pub fn lenient_bool(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::String(s) => match s.trim().to_ascii_lowercase().as_str() {
            "true" | "yes" => Some(true),
            "false" | "no" => Some(false),
            _ => None,
        },
        Value::Null | Value::Number(_) | Value::Array(_) | Value::Object(_) => None,
    }
}

/// The first `max` characters of the trimmed `text`, with `...` when it was longer: a reply quoted
/// in a reason or an error.
pub fn preview(text: &str, max: usize) -> String {
    let t = text.trim();
    match t.char_indices().nth(max) {
        Some((i, _)) => format!("{}...", &t[..i]),
        None => t.to_string(),
    }
}

/// The list in a reply's JSON: `v` itself when it is an array, else the first of `keys` holding an
/// array, else the first array value of the object.
pub fn find_list<'a>(v: &'a Value, keys: &[&str]) -> Option<&'a Vec<Value>> {
    match v {
        Value::Array(a) => Some(a),
        Value::Object(o) => keys
            .iter()
            .find_map(|k| o.get(*k).and_then(Value::as_array))
            .or_else(|| o.values().find_map(Value::as_array)),
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => None,
    }
}

/// Extract a JSON value from a model reply.
///
/// Tried in order: the whole (trimmed) text; the first ```` ``` ```` fenced block (```` ```json ````
/// or bare); the span from the first `{` to the last `}` or from the first `[` to the last `]`
/// (whichever opens first is tried first); the first complete object or list followed by other
/// text; last, a reply cut short inside a list (the token limit
/// reached) keeps the list's complete elements (see [`repair_truncated`]). The whole text, the
/// block and the spans are each also tried without trailing commas (`{"a": [1, 2,],}`). Returns
/// `None` when nothing parses.
pub fn extract_json(text: &str) -> Option<Value> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return None;
    }
    if let Some(value) = parse(trimmed) {
        return Some(value);
    }
    if let Some(value) = first_fenced_block(trimmed).and_then(|block| parse(block.trim())) {
        return Some(value);
    }
    let object = span(trimmed, '{', '}');
    let array = span(trimmed, '[', ']');
    let mut candidates: Vec<(usize, &str)> = object.into_iter().chain(array).collect();
    candidates.sort_by_key(|(start, _)| *start);
    candidates
        .into_iter()
        .find_map(|(_, candidate)| parse(candidate))
        .or_else(|| first_value(trimmed))
        .or_else(|| repair_truncated(trimmed))
}

/// `candidate` as JSON: as it is, else with its strings mended ([`strings_mended`]), each also
/// tried without trailing commas.
fn parse(candidate: &str) -> Option<Value> {
    let as_is = |text: &str| {
        serde_json::from_str(text)
            .ok()
            .or_else(|| without_trailing_commas(text).and_then(|t| serde_json::from_str(&t).ok()))
    };
    as_is(candidate).or_else(|| strings_mended(candidate).and_then(|t| as_is(&t)))
}

/// `text` with what JSON forbids inside its strings mended: a raw control character is escaped (a
/// raw line break becomes `\n`), and a `\u` escape of half a surrogate pair without its other half
/// becomes U+FFFD (the replacement character); `None` when no string needed it. A backend that
/// enforces a schema by grammar lets a model write both: llama-cpp-python's string rule takes any
/// character but `"` and `\`, and any four hex digits after `\u`.
fn strings_mended(text: &str) -> Option<String> {
    let surrogate = |hex: &str| u16::from_str_radix(hex, 16).ok().filter(|u| (0xD800..=0xDFFF).contains(u));
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len() + 16);
    let mut in_string = false;
    let mut changed = false;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if !in_string {
            in_string = c == '"';
            out.push(c);
            continue;
        }
        match c {
            '"' => {
                in_string = false;
                out.push(c);
            }
            '\\' => {
                let Some((_, next)) = chars.next() else {
                    out.push(c);
                    break;
                };
                let hex = text.get(i + 2..i + 6).filter(|_| next == 'u');
                match hex.and_then(surrogate) {
                    Some(0xD800..=0xDBFF)
                        if bytes.get(i + 6..i + 8) == Some(b"\\u")
                            && text.get(i + 8..i + 12).and_then(surrogate).is_some_and(|low| low >= 0xDC00) =>
                    {
                        // A whole pair: kept, both halves.
                        out.push_str(&text[i..i + 12]);
                        for _ in 0..10 {
                            chars.next();
                        }
                    }
                    Some(_) => {
                        changed = true;
                        out.push_str("\\ufffd");
                        for _ in 0..4 {
                            chars.next();
                        }
                    }
                    None => {
                        out.push(c);
                        out.push(next);
                    }
                }
            }
            c if c.is_ascii_control() && c != '\u{7f}' => {
                changed = true;
                match c {
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\t' => out.push_str("\\t"),
                    other => out.push_str(&format!("\\u{:04x}", other as u32)),
                }
            }
            c => out.push(c),
        }
    }
    changed.then_some(out)
}

/// `text` without the commas that come right before a `}` or `]` (whitespace between allowed),
/// outside strings; `None` when it has none.
fn without_trailing_commas(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut in_string = false;
    let mut escaped = false;
    // Where in `out` the last comma is, while only whitespace has followed it.
    let mut comma: Option<usize> = None;
    let mut removed = false;
    for c in text.chars() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                (false, _) => {}
            }
        } else if c == ',' {
            comma = Some(out.len());
        } else if c == '}' || c == ']' {
            if let Some(at) = comma.take() {
                out.remove(at);
                removed = true;
            }
        } else if !c.is_whitespace() {
            comma = None;
            in_string = c == '"';
        }
        out.push(c);
    }
    removed.then_some(out)
}

/// The first complete object or list, ignoring whatever follows it (`{"a": 1}\n{" ]}`).
fn first_value(text: &str) -> Option<Value> {
    let start = text.find(['{', '['])?;
    serde_json::Deserializer::from_str(&text[start..]).into_iter::<Value>().next()?.ok()
}

/// A JSON value cut short (`{"items": [{"q": "a"}, {"q": "b"}, {"q": "c`): the text up to the last
/// element completed inside a list, with the open lists and objects closed
/// (`{"items": [{"q": "a"}, {"q": "b"}]}`). `None` when no list element was completed. A value
/// cut outside any list is not guessed at.
pub fn repair_truncated(text: &str) -> Option<Value> {
    let start = text.find(['{', '['])?;
    let body = &text[start..];
    let mut open: Vec<u8> = Vec::new();
    let mut in_string = false;
    let mut escaped = false;
    let mut cut: Option<(usize, Vec<u8>)> = None;
    for (i, b) in body.bytes().enumerate() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                (false, _) => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => open.push(b),
            b'}' | b']' => {
                open.pop();
                if open.is_empty() {
                    // Complete after all: not a truncation.
                    return None;
                }
                if open.last() == Some(&b'[') {
                    cut = Some((i + 1, open.clone()));
                }
            }
            _ => {}
        }
    }
    let (end, still_open) = cut?;
    let mut repaired = body[..end].to_string();
    for b in still_open.iter().rev() {
        repaired.push(if *b == b'{' { '}' } else { ']' });
    }
    serde_json::from_str(&repaired).ok()
}

/// Content of the first fenced code block, without the info string (`json`).
fn first_fenced_block(text: &str) -> Option<&str> {
    let open = text.find("```")?;
    let after_fence = &text[open + 3..];
    // The info string runs to the end of the line; a block may also start on the fence line
    // when there is no info string (```{"a":1}```).
    let body_start = match after_fence.find('\n') {
        Some(newline)
            if after_fence[..newline].trim().chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') =>
        {
            newline + 1
        }
        _ => 0,
    };
    let body = &after_fence[body_start..];
    let close = body.find("```")?;
    Some(&body[..close])
}

/// `(start, text[first open ..= last close])` when both exist in order.
fn span(text: &str, open: char, close: char) -> Option<(usize, &str)> {
    let start = text.find(open)?;
    let end = text.rfind(close)?;
    (end > start).then(|| (start, &text[start..=end]))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{extract_json, lenient_bool, preview, reply_json};
    use crate::types::ChatResponse;

    #[test]
    fn first_complete_value_before_trailing_text() {
        let text = "{\"questions\": [\"Is it kind?\", \"yes?\"]}\n{\" ]}";
        assert_eq!(extract_json(text), Some(json!({"questions": ["Is it kind?", "yes?"]})));
    }

    #[test]
    fn raw_line_breaks_inside_strings_are_read_as_escaped() {
        // A reply llama-cpp-python's server let SmolLM2 write under the schema's grammar.
        let text = "{\"approach\":\"17 * 23\", \"confidence\":0.47, \"final_answer\":\"438.88 }\n{\n    \",\"reasoning_steps\":[\"{\"] } ";
        assert_eq!(
            extract_json(text),
            Some(
                json!({"approach": "17 * 23", "confidence": 0.47, "final_answer": "438.88 }\n{\n    ", "reasoning_steps": ["{"]})
            )
        );
        // Tabs, carriage returns and other control characters too; escapes already there are kept,
        // and a break between values (outside strings) needs nothing.
        assert_eq!(
            extract_json("{\"a\": \"x\\\"\ty\r\u{1}\",\n\"b\": [1,]}"),
            Some(json!({"a": "x\"\ty\r\u{1}", "b": [1]}))
        );
        assert_eq!(super::strings_mended("{\"a\":\n \"b\"}"), None);
        // Half a surrogate pair (any four hex digits pass the grammar) becomes U+FFFD; a whole pair
        // and other escapes are kept.
        let text = r#"{"a": ["\uD8EBQ\"\n", "\uD83D\uDE00 \u00e9", "\uDC00x"]}"#;
        assert_eq!(extract_json(text), Some(json!({"a": ["\u{fffd}Q\"\n", "\u{1F600} \u{e9}", "\u{fffd}x"]})));
    }

    #[test]
    fn truncated_lists_keep_their_complete_elements() {
        let cut = r#"{"items": [{"question": "Is it short?"}, {"question": "Does it say \"hi\" {ok}?"}, {"question": "Is it po"#;
        assert_eq!(
            extract_json(cut),
            Some(json!({"items": [{"question": "Is it short?"}, {"question": "Does it say \"hi\" {ok}?"}]}))
        );
        let cut = r#"{"answers": [{"question_index": 1, "answer": "YES"}, {"question_index": 2, "ans"#;
        assert_eq!(extract_json(cut), Some(json!({"answers": [{"question_index": 1, "answer": "YES"}]})));
        // Nothing complete inside a list, or cut outside a list: not guessed at.
        assert_eq!(extract_json(r#"{"items": [{"question": "Is"#), None);
        assert_eq!(extract_json(r#"{"reasoning": "because", "generally_applic"#), None);
        assert_eq!(super::repair_truncated(r#"{"a": [1]}"#), None);
    }

    #[test]
    fn whole_text() {
        assert_eq!(extract_json(r#"  {"a": 1} "#), Some(json!({"a": 1})));
        assert_eq!(extract_json("[1, 2]"), Some(json!([1, 2])));
        assert_eq!(extract_json("true"), Some(json!(true)));
    }

    #[test]
    fn fenced_block_with_and_without_tag() {
        let text = "Here you go:\n```json\n{\"score\": 3}\n```\nanything else?";
        assert_eq!(extract_json(text), Some(json!({"score": 3})));
        let text = "```\n[\"x\"]\n```";
        assert_eq!(extract_json(text), Some(json!(["x"])));
        let text = "inline ```{\"k\": true}``` fence";
        assert_eq!(extract_json(text), Some(json!({"k": true})));
    }

    #[test]
    fn first_brace_to_last_brace() {
        let text = "Sure! {\"items\": [{\"id\": 1}, {\"id\": 2}]} Hope this helps.";
        assert_eq!(extract_json(text), Some(json!({"items": [{"id": 1}, {"id": 2}]})));
    }

    #[test]
    fn top_level_array_in_prose() {
        let text = "The list: [{\"id\": 1}, {\"id\": 2}] done";
        assert_eq!(extract_json(text), Some(json!([{"id": 1}, {"id": 2}])));
    }

    #[test]
    fn object_inside_brackets_of_prose_falls_back() {
        // '[' opens first but the bracket span is not JSON; the brace span is.
        let text = "[note] result: {\"ok\": 1} [end]";
        assert_eq!(extract_json(text), Some(json!({"ok": 1})));
    }

    #[test]
    fn broken_fence_falls_back_to_braces() {
        let text = "```json\n{\"a\": 1}\n(no closing fence)";
        assert_eq!(extract_json(text), Some(json!({"a": 1})));
    }

    #[test]
    fn trailing_commas_are_dropped_outside_strings() {
        let text = "Result: {\"items\": [1, 2,\n], \"note\": \"a,}\",}";
        assert_eq!(extract_json(text), Some(json!({"items": [1, 2], "note": "a,}"})));
        assert_eq!(extract_json("```json\n[{\"a\": 1,},]\n```"), Some(json!([{"a": 1}])));
        assert_eq!(super::without_trailing_commas("[1, 2]"), None);
    }

    #[test]
    fn nothing_parses() {
        assert_eq!(extract_json(""), None);
        assert_eq!(extract_json("YES"), None);
        assert_eq!(extract_json("{not json}"), None);
        assert_eq!(extract_json("} backwards {"), None);
    }

    #[test]
    fn reply_json_prefers_the_structured_value() {
        let structured = ChatResponse { json: Some(json!({"a": 1})), text: "{\"a\": 2}".into(), ..Default::default() };
        assert_eq!(reply_json(&structured), Some(json!({"a": 1})));
        let text = ChatResponse { text: "Sure: {\"a\": 2}".into(), ..Default::default() };
        assert_eq!(reply_json(&text), Some(json!({"a": 2})));
        assert_eq!(reply_json(&ChatResponse::default()), None);
    }

    #[test]
    fn lenient_bool_reads_what_models_write() {
        assert_eq!(lenient_bool(&json!(true)), Some(true));
        assert_eq!(lenient_bool(&json!(" Yes ")), Some(true));
        assert_eq!(lenient_bool(&json!("FALSE")), Some(false));
        assert_eq!(lenient_bool(&json!("no")), Some(false));
        assert_eq!(lenient_bool(&json!("maybe")), None);
        assert_eq!(lenient_bool(&json!(1)), None);
    }

    #[test]
    fn preview_cuts_at_characters() {
        assert_eq!(preview("  short  ", 80), "short");
        assert_eq!(preview("Grüße aus Köln", 4), "Grüß...");
        assert_eq!(preview("abcd", 4), "abcd");
    }
}
