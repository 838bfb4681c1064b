//! `[backends.<name>]`: one model backend's settings, declared, defaulted and checked here once.
//!
//! A setting the model client has a default for is an `Option` (or a documented 0): unset, the
//! client's own default applies (`assay_llm::OpenAiConfig::default`, the one place it is
//! written), so neither `default.toml` nor this file repeats it. Every check of a backend's
//! values is here ([`check_backends`]), run when the configuration is loaded, and its error names
//! the key (`backends.openai.hedge_factor: ...`).

use std::collections::BTreeMap;

use assay_domain::Usage;
use serde::Deserialize;

use crate::ConfigError;

/// One model backend.
#[derive(Debug, Clone, Deserialize)]
pub struct BackendConfig {
    /// "openai" or "local".
    pub kind: String,
    #[serde(default)]
    pub base_url: String,
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub embedding_model: String,
    /// The request field that carries the token limit (openai backends; unset: the client's,
    /// `max_tokens`).
    #[serde(default)]
    pub max_tokens_field: Option<MaxTokensField>,
    /// Hard cap on requests in flight (openai backends; 0 = the client's default).
    #[serde(default)]
    pub max_concurrency: u32,
    /// Requests in flight at the start; the limit then adapts to the backend (grows while latency
    /// stays flat, cut on latency rises and on 429 / 503 / timeouts once they are most of the
    /// recent answers). 0 = fixed at `max_concurrency`; unset: the client's default.
    #[serde(default)]
    pub initial_concurrency: Option<u32>,
    /// Send `response_format: json_schema` (unset: the client's default, yes).
    #[serde(default)]
    pub supports_json_schema: Option<bool>,
    /// How structured output is sent (openai backends): `auto` (unset; negotiated once per model,
    /// strongest form first: `json_schema`, `json_object` with the schema as llama-cpp-python takes
    /// it, `json_mode`, the schema in the prompt), or one of those forms, fixed.
    #[serde(default)]
    pub structured_output: Option<String>,
    /// The HTTP API the server speaks (openai backends): `openai` (its OpenAI-compatible
    /// endpoints) or `ollama` (Ollama's native `/api/chat` and `/api/embed`, the schema in its
    /// `format`). Unset: `ollama` for a `base_url` ending in `/api`, else `openai`.
    #[serde(default)]
    pub api: Option<String>,
    /// Ask for first-token logprobs (unset: the client's default, yes).
    #[serde(default)]
    pub supports_logprobs: Option<bool>,
    #[serde(default)]
    pub models_dir: String,
    /// Ceiling of one HTTP attempt's timeout, seconds (openai backends; 0 = the client's default).
    #[serde(default)]
    pub request_timeout_secs: u64,
    /// Per-attempt timeouts from the backend's observed latency (openai backends; unset: the
    /// client's default, on).
    #[serde(default)]
    pub adaptive_timeout: Option<bool>,
    /// Least adaptive timeout, milliseconds (0 = the client's default).
    #[serde(default)]
    pub timeout_floor_ms: u64,
    /// Adaptive timeout = this x the p95 of recent latencies: at least 1 (0 = the client's
    /// default).
    #[serde(default)]
    pub timeout_multiplier: f64,
    /// Hedged requests: an attempt unanswered after this x its expected latency gets a
    /// duplicate beside it (when a concurrency slot is free and the backend's hedge budget, about
    /// one duplicate per ten answers, allows), the first success taken, so a hung or lost request
    /// costs about that many times the usual latency instead of an attempt timeout, and only
    /// stragglers are paid twice. At least 1, or 0 = only the last attempt is hedged (after a
    /// first attempt's timeout). Unset: the client's default.
    #[serde(default)]
    pub hedge_factor: Option<f64>,
    /// Prices of this backend's models, USD per million tokens, by model name (`"*"`: any model
    /// without its own entry). A model without a price costs "unknown", never zero. Each rate is
    /// finite, from 0 to [`MAX_PRICE_PER_MTOK`]; `cached_input` at most `input`; a key other than
    /// `input`, `output` and `cached_input` is an error (see [`check_prices`]).
    #[serde(default, deserialize_with = "strict_prices")]
    pub prices: BTreeMap<String, Price>,
    /// Requests per minute this backend (this process) may send: a token bucket in front of the
    /// adaptive concurrency limit (openai backends; 0 = no limit).
    #[serde(default)]
    pub requests_per_minute: u32,
    /// Tokens (prompt + completion) per minute this backend (this process) may use (openai
    /// backends; 0 = no limit).
    #[serde(default)]
    pub tokens_per_minute: u64,
    /// Most US dollars this backend may cost per UTC day, counted by the gateway from the price
    /// table (`prices`) across every run and every gateway sharing the run store; once reached,
    /// new runs that use the backend are refused (RESOURCE_EXHAUSTED) and running ones stop as at
    /// the end of a budget (0 = no cap).
    #[serde(default)]
    pub daily_spend_usd: f64,
}

/// Name of the request field that carries the token limit (`max_tokens_field`; any other value
/// is an error naming the key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MaxTokensField {
    /// `max_tokens` (most servers: llama.cpp, vLLM, older OpenAI models).
    #[default]
    MaxTokens,
    /// `max_completion_tokens` (newer OpenAI models).
    MaxCompletionTokens,
}

impl MaxTokensField {
    pub fn as_str(self) -> &'static str {
        match self {
            MaxTokensField::MaxTokens => "max_tokens",
            MaxTokensField::MaxCompletionTokens => "max_completion_tokens",
        }
    }
}

/// A model's price, USD per million tokens.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq)]
pub struct Price {
    /// Prompt tokens.
    pub input: f64,
    /// Completion tokens.
    pub output: f64,
    /// Prompt tokens the provider served from its prompt cache (`prompt_tokens_details.
    /// cached_tokens`); absent = the input price.
    #[serde(default)]
    pub cached_input: Option<f64>,
}

impl Price {
    /// The cost of `usage` at this price, USD.
    pub fn cost(&self, usage: &Usage) -> f64 {
        let cached = usage.cached_prompt_tokens.min(usage.prompt_tokens);
        let fresh = usage.prompt_tokens - cached;
        (fresh as f64 * self.input
            + cached as f64 * self.cached_input.unwrap_or(self.input)
            + usage.completion_tokens as f64 * self.output)
            / 1e6
    }
}

/// Most a price may be, USD per million tokens: far above any model's, and low enough that a
/// cost never overflows (`1e308` per million tokens made every cost `inf`).
pub const MAX_PRICE_PER_MTOK: f64 = 10_000.0;

/// A [`Price`] as the configuration spells it: an unknown key (`inptu = 2.5`) is an error naming
/// it, not a rate silently left out.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PriceEntry {
    input: f64,
    output: f64,
    #[serde(default)]
    cached_input: Option<f64>,
}

/// A price table read through [`PriceEntry`] (the `config` crate's error names the backend and
/// the model: "unknown field `inptu`, ... for key `backends.openai.prices.gpt-4o`").
fn strict_prices<'de, D: serde::Deserializer<'de>>(d: D) -> Result<BTreeMap<String, Price>, D::Error> {
    let table = BTreeMap::<String, PriceEntry>::deserialize(d)?;
    Ok(table
        .into_iter()
        .map(|(model, PriceEntry { input, output, cached_input })| (model, Price { input, output, cached_input }))
        .collect())
}

/// A number as an error quotes it: `1e308`, not a 1 and 308 zeros.
fn shown(rate: f64) -> String {
    if rate.abs() >= 1e9 { format!("{rate:e}") } else { format!("{rate}") }
}

/// The values of `backends.<name>.structured_output`.
pub const STRUCTURED_OUTPUT_FORMS: [&str; 6] = ["auto", "json_schema", "json_object", "tgi", "json_mode", "prompt"];

/// The values of `backends.<name>.api`.
pub const APIS: [&str; 2] = ["openai", "ollama"];

/// Every backend's settings usable: its price table ([`check_prices`]), `hedge_factor` and
/// `timeout_multiplier`. The error names the key. Run by `load`; a configuration built or changed
/// in code is checked again where backends are built from it.
pub fn check_backends(backends: &BTreeMap<String, BackendConfig>) -> Result<(), ConfigError> {
    check_prices(backends)?;
    for (name, entry) in backends {
        let error = |key: &'static str, message: String| ConfigError::Backend { backend: name.clone(), key, message };
        if let Some(h) = entry.hedge_factor
            && !(h == 0.0 || (h.is_finite() && h >= 1.0))
        {
            return Err(error(
                "hedge_factor",
                format!(
                    "is {}; it must be at least 1 (a duplicate sent before the usual latency would double every \
                     call), or 0 to hedge only the last attempt",
                    shown(h)
                ),
            ));
        }
        if let Some(form) = &entry.structured_output
            && !STRUCTURED_OUTPUT_FORMS.contains(&form.as_str())
        {
            return Err(error(
                "structured_output",
                format!("is {form:?}; it must be one of {}", STRUCTURED_OUTPUT_FORMS.join(", ")),
            ));
        }
        if let Some(api) = &entry.api
            && !APIS.contains(&api.as_str())
        {
            return Err(error("api", format!("is {api:?}; it must be one of {}", APIS.join(", "))));
        }
        let m = entry.timeout_multiplier;
        if !(m == 0.0 || (m.is_finite() && m >= 1.0)) {
            return Err(error(
                "timeout_multiplier",
                format!(
                    "is {}; it must be at least 1 (a timeout below the usual latency cuts healthy calls), or 0 for \
                     the client's default",
                    shown(m)
                ),
            ));
        }
    }
    Ok(())
}

/// Every rate of every backend's price table usable: finite, from 0 to [`MAX_PRICE_PER_MTOK`],
/// and `cached_input` (prompt tokens served from the provider's cache) at most `input`. The error
/// names the backend, the model and the rate.
pub fn check_prices(backends: &BTreeMap<String, BackendConfig>) -> Result<(), ConfigError> {
    for (backend, entry) in backends {
        for (model, price) in &entry.prices {
            let Price { input, output, cached_input } = *price;
            let error = |field: &'static str, message: String| ConfigError::Price {
                backend: backend.clone(),
                model: model.clone(),
                field,
                message,
            };
            let rates = [("input", Some(input)), ("output", Some(output)), ("cached_input", cached_input)];
            for (field, rate) in rates {
                let Some(rate) = rate else { continue };
                if !rate.is_finite() {
                    return Err(error(
                        field,
                        format!("is {rate}; a price must be a finite number of USD per million tokens"),
                    ));
                }
                if rate < 0.0 {
                    return Err(error(field, format!("is {}; a price must not be negative", shown(rate))));
                }
                if rate > MAX_PRICE_PER_MTOK {
                    return Err(error(
                        field,
                        format!(
                            "is {}; a price must be at most {MAX_PRICE_PER_MTOK} USD per million tokens",
                            shown(rate)
                        ),
                    ));
                }
            }
            if let Some(cached) = cached_input.filter(|c| *c > input) {
                return Err(error(
                    "cached_input",
                    format!(
                        "is {cached}, above input ({input}); prompt tokens served from the provider's cache cost at \
                         most the input price"
                    ),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::{AssayConfig, load_from};

    use super::*;

    #[test]
    fn cost_per_million_with_cached_input() {
        let usage = Usage {
            calls: 1,
            prompt_tokens: 2000,
            cached_prompt_tokens: 1000,
            completion_tokens: 500,
            ..Usage::default()
        };
        let p = Price { input: 0.15, output: 0.60, cached_input: Some(0.075) };
        let c = p.cost(&usage);
        assert!((c - (1000.0 * 0.15 + 1000.0 * 0.075 + 500.0 * 0.60) / 1e6).abs() < 1e-15, "{c}");
        let no_cached_price = Price { cached_input: None, ..p };
        let usage = Usage { completion_tokens: 0, ..usage };
        assert!((no_cached_price.cost(&usage) - 2000.0 * 0.15 / 1e6).abs() < 1e-15);
    }

    #[test]
    fn client_defaults_are_left_to_the_client() {
        let openai = &AssayConfig::defaults().backends["openai"];
        assert_eq!(openai.hedge_factor, None);
        assert_eq!(openai.initial_concurrency, None);
        assert_eq!(
            (openai.supports_json_schema, openai.supports_logprobs, openai.adaptive_timeout),
            (None, None, None)
        );
        assert_eq!(openai.max_tokens_field, None);
        assert_eq!((openai.max_concurrency, openai.timeout_multiplier), (0, 0.0));
        let c = load_from(
            "[backends.openai]\nhedge_factor = 3.0\ninitial_concurrency = 0\nmax_tokens_field = \"max_completion_tokens\"\n",
        )
        .unwrap();
        let openai = &c.backends["openai"];
        assert_eq!(openai.hedge_factor, Some(3.0));
        assert_eq!(openai.initial_concurrency, Some(0), "0 = a fixed limit, not the default");
        assert_eq!(openai.max_tokens_field, Some(MaxTokensField::MaxCompletionTokens));
        assert_eq!(
            load_from("[backends.openai]\nhedge_factor = 0\n").unwrap().backends["openai"].hedge_factor,
            Some(0.0)
        );
    }

    #[test]
    fn structured_output_is_one_of_its_forms() {
        let c = load_from("[backends.openai]\nstructured_output = \"json_object\"\n").unwrap();
        assert_eq!(c.backends["openai"].structured_output.as_deref(), Some("json_object"));
        let c = load_from("[backends.openai]\nstructured_output = \"tgi\"\napi = \"ollama\"\n").unwrap();
        assert_eq!(c.backends["openai"].api.as_deref(), Some("ollama"));
        let e = load_from("[backends.openai]\napi = \"anthropic\"\n").unwrap_err().to_string();
        assert!(e.contains("backends.openai.api") && e.contains("openai, ollama"), "{e}");
        let e = load_from("[backends.openai]\nstructured_output = \"grammar\"\n").unwrap_err().to_string();
        assert!(e.contains("structured_output") && e.contains("json_mode"), "{e}");
    }

    #[test]
    fn a_hedge_factor_below_one_is_refused_naming_the_key() {
        for bad in ["0.5", "-1.0", "nan", "inf"] {
            let e = load_from(&format!("[backends.openai]\nhedge_factor = {bad}\n")).unwrap_err().to_string();
            assert!(e.starts_with("configuration error: backends.openai.hedge_factor: is "), "{bad}: {e}");
            assert!(e.contains("it must be at least 1"), "{e}");
        }
        let e = load_from("[backends.vllm]\nkind = \"openai\"\nhedge_factor = 0.5\n").unwrap_err().to_string();
        assert_eq!(
            e,
            "configuration error: backends.vllm.hedge_factor: is 0.5; it must be at least 1 (a duplicate sent before \
             the usual latency would double every call), or 0 to hedge only the last attempt"
        );
        assert!(matches!(
            load_from("[backends.openai]\nhedge_factor = 0.5\n"),
            Err(ConfigError::Backend { ref backend, key: "hedge_factor", .. }) if backend == "openai"
        ));
    }

    #[test]
    fn a_timeout_multiplier_below_one_is_refused_naming_the_key() {
        let e = load_from("[backends.openai]\ntimeout_multiplier = 0.5\n").unwrap_err().to_string();
        assert_eq!(
            e,
            "configuration error: backends.openai.timeout_multiplier: is 0.5; it must be at least 1 (a timeout below \
             the usual latency cuts healthy calls), or 0 for the client's default"
        );
        let e = load_from("[backends.openai]\ntimeout_multiplier = -2\n").unwrap_err().to_string();
        assert!(e.starts_with("configuration error: backends.openai.timeout_multiplier: is -2;"), "{e}");
        assert!(load_from("[backends.openai]\ntimeout_multiplier = 1.5\n").is_ok());
    }

    #[test]
    fn an_unknown_max_tokens_field_is_refused_naming_the_key() {
        // Was read as `max_tokens` without a word.
        let e = load_from("[backends.openai]\nmax_tokens_field = \"max_completion_token\"\n").unwrap_err().to_string();
        assert!(e.contains("max_completion_token") && e.contains("backends.openai.max_tokens_field"), "{e}");
    }
}
