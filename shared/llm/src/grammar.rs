//! GBNF grammars (llama.cpp syntax) for constrained decoding: a JSON-schema subset and closed
//! choice sets.
//!
//! Supported schema subset: `type` object (properties, required; properties are emitted in the
//! order of `propertyOrdering` when present, else of `required`, then the others alphabetically,
//! since a parsed JSON object does not keep its key order; optional ones may be left out), string (`minLength`/`maxLength`), boolean,
//! number, integer (`minimum >= 0` drops the sign), null, array (`items`, `minItems`, `maxItems`),
//! `enum` and `const` of JSON values, `type` lists, `anyOf`/`oneOf`, local `$ref`
//! (`#/$defs/...`, `#/definitions/...`); a schema with no type accepts any JSON value. The output
//! is compact JSON (no whitespace), so it always parses with `serde_json`.

use std::collections::BTreeMap;

use serde_json::Value;

/// Why a schema could not be turned into a grammar.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsupported JSON schema at {path}: {message}")]
pub struct GrammarError {
    pub path: String,
    pub message: String,
}

/// Largest number of digits allowed in an integer part (keeps outputs short and bounded).
const MAX_INT_DIGITS: usize = 15;
/// Largest number of fraction digits.
const MAX_FRAC_DIGITS: usize = 8;

/// Quotes `s` as a GBNF string literal.
pub fn gbnf_literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Case variants of a choice option accepted by [`choice_grammar`]: as given, lower case, upper
/// case and capitalised. Small models put most of their probability on "Yes"/"No" and little on
/// "YES"/"NO"; accepting the variants lets the model's real preference decide, and
/// [`canonical_choice`] maps the reply back to the option as given.
pub fn choice_variants(option: &str) -> Vec<String> {
    let mut cap = option.to_lowercase();
    if let Some(first) = cap.chars().next() {
        cap = first.to_uppercase().chain(cap.chars().skip(1)).collect();
    }
    let mut out = vec![option.to_string()];
    for v in [option.to_lowercase(), option.to_uppercase(), cap] {
        if !out.contains(&v) {
            out.push(v);
        }
    }
    out
}

/// Whether options are distinct ignoring case (then case variants are accepted).
fn case_insensitive_distinct(options: &[String]) -> bool {
    let mut lower: Vec<String> = options.iter().map(|o| o.to_lowercase()).collect();
    lower.sort();
    lower.dedup();
    lower.len() == options.len()
}

/// A grammar whose only sentences are the given options (and their case variants, see
/// [`choice_variants`], when the options differ other than by case).
pub fn choice_grammar(options: &[String]) -> Result<String, GrammarError> {
    if options.is_empty() || options.iter().any(String::is_empty) {
        return Err(GrammarError { path: "choice".into(), message: "options must be non-empty strings".into() });
    }
    let variants = case_insensitive_distinct(options);
    let alts: Vec<String> = options
        .iter()
        .flat_map(|o| if variants { choice_variants(o) } else { vec![o.clone()] })
        .map(|v| gbnf_literal(&v))
        .collect();
    // An optional leading space: after "Answer:" a completion-style prompt continues with " Yes".
    Ok(format!("root ::= \" \"? ( {} )\n", alts.join(" | ")))
}

/// The option a constrained reply stands for (the option as given, whatever its case).
pub fn canonical_choice<'a>(options: &'a [String], reply: &str) -> Option<&'a str> {
    let reply = reply.trim();
    options
        .iter()
        .find(|o| o.as_str() == reply)
        .or_else(|| {
            if case_insensitive_distinct(options) {
                options.iter().find(|o| o.to_lowercase() == reply.to_lowercase())
            } else {
                None
            }
        })
        .map(String::as_str)
}

/// A grammar for JSON values matching `schema` (the subset described in the module docs).
pub fn json_schema_grammar(schema: &Value) -> Result<String, GrammarError> {
    let mut b = Builder { root: schema, rules: BTreeMap::new(), order: Vec::new(), refs: BTreeMap::new() };
    let root = b.visit(schema, "root", "#")?;
    if root != "root" {
        b.add("root", root);
    }
    let mut out = String::new();
    for name in &b.order {
        out.push_str(&format!("{name} ::= {}\n", b.rules[name]));
    }
    // Shared primitives, added when referenced (dependencies come later in the list).
    for (name, body) in PRIMITIVES {
        if out.contains(name) {
            out.push_str(&format!("{name} ::= {body}\n"));
        }
    }
    Ok(out)
}

const PRIMITIVES: [(&str, &str); 6] = [
    ("json-value", r#"json-object | json-array | json-string | json-number | "true" | "false" | "null""#),
    ("json-object", r#""{" ( json-string ":" json-value ( "," json-string ":" json-value )* )? "}""#),
    ("json-array", r#""[" ( json-value ( "," json-value )* )? "]""#),
    ("json-number", r#""-"? ( [0-9] | [1-9] [0-9]{1,14} ) ( "." [0-9]{1,8} )?"#),
    ("json-string", r#""\"" json-char* "\"""#),
    ("json-char", r#"[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})"#),
];

struct Builder<'a> {
    root: &'a Value,
    rules: BTreeMap<String, String>,
    order: Vec<String>,
    refs: BTreeMap<String, String>,
}

impl<'a> Builder<'a> {
    fn add(&mut self, name: &str, body: String) -> String {
        let mut unique = name.to_string();
        let mut i = 1;
        while self.rules.contains_key(&unique) {
            i += 1;
            unique = format!("{name}-{i}");
        }
        self.rules.insert(unique.clone(), body);
        self.order.push(unique.clone());
        unique
    }

    fn err(path: &str, message: impl Into<String>) -> GrammarError {
        GrammarError { path: path.to_string(), message: message.into() }
    }

    /// Returns a grammar expression (usually a rule name) for `schema`.
    fn visit(&mut self, schema: &'a Value, name: &str, path: &str) -> Result<String, GrammarError> {
        let obj = match schema {
            Value::Bool(true) => return Ok("json-value".into()),
            Value::Bool(false) => return Err(Self::err(path, "schema `false` matches nothing")),
            Value::Object(o) => o,
            Value::Null | Value::Number(_) | Value::String(_) | Value::Array(_) => {
                return Err(Self::err(path, "schema must be an object"));
            }
        };
        if let Some(r) = obj.get("$ref") {
            let r = r.as_str().ok_or_else(|| Self::err(path, "$ref must be a string"))?;
            return self.visit_ref(r, path);
        }
        if let Some(c) = obj.get("const") {
            return Ok(self.add(name, literal_value(c)));
        }
        if let Some(e) = obj.get("enum") {
            let items = e.as_array().ok_or_else(|| Self::err(path, "enum must be an array"))?;
            if items.is_empty() {
                return Err(Self::err(path, "empty enum"));
            }
            let alts: Vec<String> = items.iter().map(literal_value).collect();
            return Ok(self.add(name, alts.join(" | ")));
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(list) = obj.get(key) {
                let list = list.as_array().ok_or_else(|| Self::err(path, format!("{key} must be an array")))?;
                let mut alts = Vec::new();
                for (i, s) in list.iter().enumerate() {
                    alts.push(self.visit(s, &format!("{name}-{i}"), &format!("{path}/{key}/{i}"))?);
                }
                if alts.is_empty() {
                    return Err(Self::err(path, format!("empty {key}")));
                }
                return Ok(self.add(name, alts.join(" | ")));
            }
        }
        match obj.get("type") {
            Some(Value::String(t)) => self.visit_type(obj, t, name, path),
            Some(Value::Array(types)) => {
                let mut alts = Vec::new();
                for t in types {
                    let t = t.as_str().ok_or_else(|| Self::err(path, "type list must hold strings"))?;
                    alts.push(self.visit_type(obj, t, &format!("{name}-{t}"), path)?);
                }
                if alts.is_empty() {
                    return Err(Self::err(path, "empty type list"));
                }
                Ok(self.add(name, alts.join(" | ")))
            }
            Some(_) => Err(Self::err(path, "type must be a string or a list of strings")),
            None if obj.contains_key("properties") => self.visit_type(obj, "object", name, path),
            None if obj.contains_key("items") => self.visit_type(obj, "array", name, path),
            None => Ok("json-value".into()),
        }
    }

    fn visit_ref(&mut self, r: &str, path: &str) -> Result<String, GrammarError> {
        if let Some(rule) = self.refs.get(r) {
            return Ok(rule.clone());
        }
        let pointer =
            r.strip_prefix('#').ok_or_else(|| Self::err(path, format!("only local $ref supported, got {r}")))?;
        let target = self.root.pointer(pointer).ok_or_else(|| Self::err(path, format!("unresolved $ref {r}")))?;
        let base = pointer.rsplit('/').next().unwrap_or("ref");
        let rule_name: String =
            format!("ref-{base}").chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
        // Reserve the name first so recursive schemas terminate.
        let reserved = self.add(&rule_name, String::new());
        self.refs.insert(r.to_string(), reserved.clone());
        let expr = self.visit(target, &format!("{reserved}-body"), r)?;
        self.rules.insert(reserved.clone(), expr);
        Ok(reserved)
    }

    fn visit_type(
        &mut self,
        obj: &'a serde_json::Map<String, Value>,
        t: &str,
        name: &str,
        path: &str,
    ) -> Result<String, GrammarError> {
        match t {
            "string" => {
                let min = obj.get("minLength").and_then(Value::as_u64).unwrap_or(0);
                match obj.get("maxLength").and_then(Value::as_u64) {
                    None if min == 0 => Ok("json-string".into()),
                    None => Ok(self.add(name, format!(r#""\"" json-char{{{min},}} "\"""#))),
                    Some(max) if max < min => Err(Self::err(path, "maxLength < minLength")),
                    Some(max) => Ok(self.add(name, format!(r#""\"" json-char{{{min},{max}}} "\"""#))),
                }
            }
            "boolean" => Ok(self.add(name, r#""true" | "false""#.into())),
            "null" => Ok(self.add(name, r#""null""#.into())),
            "integer" | "number" => {
                // A number in the unit interval (a score, a confidence): "0", "0.x", "1", "1.0".
                let unit_max = obj.get("maximum").and_then(Value::as_f64) == Some(1.0);
                let unit_min = obj.get("minimum").and_then(Value::as_f64).is_some_and(|m| (0.0..=1.0).contains(&m));
                if t == "number" && unit_min && unit_max {
                    return Ok(self.add(
                        name,
                        format!(
                            r#"( "0" ( "." [0-9]{{1,{MAX_FRAC_DIGITS}}} )? | "1" ( "." "0"{{1,{MAX_FRAC_DIGITS}}} )? )"#
                        ),
                    ));
                }
                let non_negative = obj.get("minimum").and_then(Value::as_f64).is_some_and(|m| m >= 0.0)
                    || obj.get("exclusiveMinimum").and_then(Value::as_f64).is_some_and(|m| m >= 0.0);
                let sign = if non_negative { "" } else { r#""-"? "# };
                let int = format!("( [0-9] | [1-9] [0-9]{{1,{}}} )", MAX_INT_DIGITS - 1);
                let frac =
                    if t == "number" { format!(r#" ( "." [0-9]{{1,{MAX_FRAC_DIGITS}}} )?"#) } else { String::new() };
                Ok(self.add(name, format!("{sign}{int}{frac}")))
            }
            "array" => {
                let item = match obj.get("items") {
                    Some(items) => self.visit(items, &format!("{name}-item"), &format!("{path}/items"))?,
                    None => "json-value".into(),
                };
                let min = obj.get("minItems").and_then(Value::as_u64).unwrap_or(0);
                let max = obj.get("maxItems").and_then(Value::as_u64);
                if max.is_some_and(|m| m < min) {
                    return Err(Self::err(path, "maxItems < minItems"));
                }
                let body = match (min, max) {
                    (_, Some(0)) => r#""[" "]""#.to_string(),
                    (0, None) => format!(r#""[" ( {item} ( "," {item} )* )? "]""#),
                    (0, Some(max)) => format!(r#""[" ( {item} ( "," {item} ){{0,{}}} )? "]""#, max - 1),
                    (min, None) => format!(r#""[" {item} ( "," {item} ){{{},}} "]""#, min - 1),
                    (min, Some(max)) => format!(r#""[" {item} ( "," {item} ){{{},{}}} "]""#, min - 1, max - 1),
                };
                Ok(self.add(name, body))
            }
            "object" => {
                let props = match obj.get("properties") {
                    Some(Value::Object(p)) => p,
                    Some(_) => return Err(Self::err(path, "properties must be an object")),
                    None => return Ok(self.add(name, "json-object".into())),
                };
                let required: Vec<&str> = obj
                    .get("required")
                    .and_then(Value::as_array)
                    .map(|r| r.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                for r in &required {
                    if !props.contains_key(*r) {
                        return Err(Self::err(path, format!("required property {r} is not in properties")));
                    }
                }
                // Property order: `propertyOrdering` when given, else the order of `required`
                // (a JSON array keeps its order; `properties` may not), then the rest.
                let ordering: Vec<&str> = obj
                    .get("propertyOrdering")
                    .and_then(Value::as_array)
                    .map(|r| r.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_else(|| required.clone());
                let mut keys: Vec<&String> =
                    ordering.iter().filter_map(|k| props.get_key_value(*k).map(|(k, _)| k)).collect();
                keys.extend(props.keys().filter(|k| !ordering.contains(&k.as_str())));
                let mut req = Vec::new();
                let mut opt = Vec::new();
                for key in keys {
                    let sub = &props[key];
                    let safe: String = key.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
                    let value = self.visit(sub, &format!("{name}-{safe}"), &format!("{path}/properties/{key}"))?;
                    let key_lit = gbnf_literal(&serde_json::to_string(key).unwrap_or_default());
                    let kv = format!(r#"{key_lit} ":" {value}"#);
                    if required.contains(&key.as_str()) {
                        req.push(kv);
                    } else {
                        opt.push(kv);
                    }
                }
                let body = if !req.is_empty() {
                    let mut s = req.join(r#" "," "#);
                    for kv in &opt {
                        s.push_str(&format!(r#" ( "," {kv} )?"#));
                    }
                    s
                } else if opt.is_empty() {
                    String::new()
                } else {
                    // Any in-order subset of the optional properties.
                    let alts: Vec<String> = (0..opt.len())
                        .map(|i| {
                            let mut s = opt[i].clone();
                            for kv in &opt[i + 1..] {
                                s.push_str(&format!(r#" ( "," {kv} )?"#));
                            }
                            s
                        })
                        .collect();
                    format!("( {} )?", alts.join(" | "))
                };
                Ok(self.add(name, format!(r#""{{" {body} "}}""#)))
            }
            other => Err(Self::err(path, format!("unsupported type {other}"))),
        }
    }
}

/// A grammar literal matching the compact JSON serialisation of `v`.
fn literal_value(v: &Value) -> String {
    gbnf_literal(&serde_json::to_string(v).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn literal_escapes() {
        assert_eq!(gbnf_literal(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(gbnf_literal("x\ny"), r#""x\ny""#);
    }

    #[test]
    fn choice() {
        let opts: Vec<String> = vec!["YES".into(), "NO".into()];
        let g = choice_grammar(&opts).unwrap();
        assert_eq!(g, "root ::= \" \"? ( \"YES\" | \"yes\" | \"Yes\" | \"NO\" | \"no\" | \"No\" )\n");
        assert!(choice_grammar(&[]).is_err());
        assert_eq!(canonical_choice(&opts, "Yes"), Some("YES"));
        assert_eq!(canonical_choice(&opts, "no"), Some("NO"));
        assert_eq!(canonical_choice(&opts, "maybe"), None);
        // Options that differ only by case are taken literally.
        let cased: Vec<String> = vec!["a".into(), "A".into()];
        assert_eq!(choice_grammar(&cased).unwrap(), "root ::= \" \"? ( \"a\" | \"A\" )\n");
        assert_eq!(canonical_choice(&cased, "A"), Some("A"));
        assert_eq!(choice_variants("not sure"), vec!["not sure", "NOT SURE", "Not sure"]);
    }

    #[test]
    fn answers_schema() {
        let schema = json!({
            "type": "object",
            "properties": {
                "answers": {
                    "type": "array", "maxItems": 3,
                    "items": {
                        "type": "object",
                        "properties": {
                            "index": {"type": "integer", "minimum": 0},
                            "answer": {"type": "string", "enum": ["YES", "NO"]}
                        },
                        "required": ["index", "answer"]
                    }
                }
            },
            "required": ["answers"]
        });
        let g = json_schema_grammar(&schema).unwrap();
        assert!(g.contains("\nroot ::= "), "{g}");
        assert!(g.contains(r#""\"YES\"" | "\"NO\"""#), "{g}");
        // `required` order wins over the alphabetical order of `properties`.
        assert!(g.contains(r#""\"index\"" ":" root-answers-item-index "," "\"answer\"""#), "{g}");
        assert!(g.contains("{0,2}"), "{g}");
        assert!(!g.contains("json-value"), "{g}");
    }

    #[test]
    fn optional_only_and_refs() {
        let schema = json!({
            "$defs": {"v": {"type": "boolean"}},
            "type": "object",
            "properties": {"a": {"$ref": "#/$defs/v"}, "b": {"type": ["number", "null"]}, "c": {}}
        });
        let g = json_schema_grammar(&schema).unwrap();
        assert!(g.contains("ref-v ::="), "{g}");
        assert!(g.contains("json-value ::="), "{g}");
        assert!(g.contains(")?"), "{g}");
    }

    #[test]
    fn unit_interval_numbers_stay_in_range() {
        let g = json_schema_grammar(&json!({"type": "number", "minimum": 0, "maximum": 1})).unwrap();
        assert!(g.contains(r#"root ::= ( "0" ( "." [0-9]{1,8} )? | "1" ( "." "0"{1,8} )? )"#), "{g}");
        let g = json_schema_grammar(&json!({"type": "number", "minimum": 0, "maximum": 100})).unwrap();
        assert!(g.contains("[1-9] [0-9]{1,14}"), "{g}");
    }

    #[test]
    fn unsupported_type_is_an_error() {
        let e = json_schema_grammar(&json!({"type": "object", "properties": {"x": {"type": "date"}}})).unwrap_err();
        assert!(e.path.contains("/properties/x"), "{e}");
    }
}
