//! Cost and budgets at the model call: [`PricedChat`] / [`PricedEmbed`] wrap a backend (under the
//! response cache, so a cache hit costs nothing and is never refused) and, for every call:
//!
//! 1. reserve its worst case from the work's budget ([`assay_budget::current`]) before it is
//!    sent: the prompt's tokens estimated from its characters, plus its `max_tokens` (a call under
//!    a limited budget without one is sent with [`DEFAULT_COMPLETION_LIMIT`]), at the price table.
//!    A reservation that does not fit waits for other calls' holds, or is refused
//!    ([`LlmError::BudgetExhausted`]): the call is never sent. A model without a price is refused
//!    under a dollar limit (its cost could not be counted);
//! 2. price its usage from the backend's [`Prices`]: `cost_usd` set and `unpriced_calls` cleared
//!    when the model has a price, left unpriced otherwise (unknown, never zero);
//! 3. count the attempts the backend may have served beyond the reply ([`crate::attempts`]): an
//!    abandoned attempt is charged its reservation when it is given up on (the attempt after it
//!    reserves its own first), whether or not the call then succeeds; a duplicate whose reply was
//!    not used is counted at the usage of the one that was;
//! 4. settle the last reservation to the reply's usage (a call that failed or was cancelled gives
//!    back what its abandoned attempts did not spend) and count the cost (`assay.llm.cost`, USD,
//!    by backend and model). The reply's usage includes its abandoned attempts.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use assay_budget::{Cost, Exhaustion, Hold};

use crate::attempts::{self, Ledger};
use opentelemetry::KeyValue;
use opentelemetry::metrics::Counter;

use crate::types::{
    ChatModel, ChatRequest, ChatResponse, EmbeddingModel, EmbeddingRequest, EmbeddingResponse, LlmError,
    ResponseFormat, Usage,
};

/// The completion limit a call under a limited budget is sent with when it has none of its own:
/// a reservation needs a worst case.
pub const DEFAULT_COMPLETION_LIMIT: u32 = 2048;

/// Tokens estimated for `chars` characters of prompt: three characters a token (English runs
/// near four; JSON and code nearer three), rounded up, so the estimate errs high.
fn prompt_tokens_of(chars: usize) -> u64 {
    (chars as u64).div_ceil(3)
}

/// A model's price, USD per million tokens (declared with the backend's settings).
pub use assay_config::Price;

/// A backend's price table: by model name, `"*"` for any model without its own entry.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Prices(BTreeMap<String, Price>);

impl Prices {
    pub fn new(table: BTreeMap<String, Price>) -> Prices {
        Prices(table)
    }

    /// The price of `model` (the requested name, else the one the backend reported), else `"*"`.
    pub fn of(&self, requested: &str, reported: &str) -> Option<&Price> {
        self.0.get(requested).or_else(|| self.0.get(reported)).or_else(|| self.0.get("*"))
    }

    /// Price `usage` in place: cost set and the calls priced when the model has a price.
    pub fn apply(&self, usage: &mut Usage, requested: &str, reported: &str) {
        if usage.calls == 0 {
            return;
        }
        if let Some(p) = self.of(requested, reported) {
            usage.cost_usd = p.cost(usage);
            usage.unpriced_calls = 0;
        } else {
            usage.cost_usd = 0.0;
            usage.unpriced_calls = usage.calls;
        }
    }
}

fn cost_counter() -> &'static Counter<f64> {
    static COST: OnceLock<Counter<f64>> = OnceLock::new();
    COST.get_or_init(|| {
        assay_telemetry::meter()
            .f64_counter("assay.llm.cost")
            .with_unit("USD")
            .with_description("Cost of model calls from the backends' price tables (priced calls only)")
            .build()
    })
}

/// Reserve `worst` from the current budget, if the work has one. A refusal because the model has
/// no price names the model and the backend (`model`, `backend`).
async fn reserve(worst: Cost, model: &str, backend: &str) -> Result<Option<Hold>, LlmError> {
    let Some(budget) = assay_budget::current() else { return Ok(None) };
    match budget.reserve(worst).await {
        Ok(hold) => Ok(Some(hold)),
        Err(refusal) if refusal.cause == Exhaustion::Unpriced && worst.unpriced => {
            Err(LlmError::BudgetExhausted(assay_budget::unpriced_model(Some((model, backend)))))
        }
        Err(refusal) => Err(LlmError::BudgetExhausted(refusal)),
    }
}

/// The worst case of a call of `prompt` tokens and up to `completion` more, at `price`.
fn worst_of(price: Option<&Price>, prompt: u64, completion: u64) -> Cost {
    let tokens = prompt.saturating_add(completion);
    match price {
        Some(p) => {
            Cost::new(tokens, assay_budget::nano_of((prompt as f64 * p.input + completion as f64 * p.output) / 1e6))
        }
        None => Cost { tokens, nano_usd: 0, unpriced: true },
    }
}

/// The prompt tokens of a chat request, estimated: its messages, its schema or choices, and a
/// few tokens of framing per message.
fn chat_prompt_tokens(request: &ChatRequest) -> u64 {
    let text: usize = request.messages.iter().map(|m| m.content.chars().count()).sum();
    let format = match &request.response_format {
        ResponseFormat::Text => 0,
        ResponseFormat::JsonSchema { name, schema } => name.len() + schema.to_string().len(),
        ResponseFormat::Choice(options) => options.iter().map(|o| o.len() + 3).sum(),
    };
    prompt_tokens_of(text + format) + 4 * request.messages.len() as u64 + 16
}

/// One abandoned attempt of `(prompt, completion)` tokens, priced as `requested` on `backend`:
/// what it is charged (its cost counts toward the backend's daily cap as any call's).
fn abandoned_attempt(prices: &Prices, backend: &str, (prompt, completion): (u64, u64), requested: &str) -> Usage {
    let mut u = Usage { calls: 1, prompt_tokens: prompt, completion_tokens: completion, ..Usage::default() };
    prices.apply(&mut u, requested, requested);
    if u.unpriced_calls == 0 && u.cost_usd > 0.0 {
        u.cost_by_backend = BTreeMap::from([(backend.to_string(), u.cost_usd)]);
    }
    u.abandoned_calls = 1;
    u.abandoned_tokens = u.tokens();
    u.abandoned_cost_usd = u.cost_usd;
    u
}

/// `usage` with `n` more requests of `one`'s tokens (duplicates of the request that answered).
fn add_duplicates(usage: &mut Usage, one: &Usage, n: u32) {
    if n == 0 {
        return;
    }
    usage.calls += n;
    usage.prompt_tokens += one.prompt_tokens * u64::from(n);
    usage.cached_prompt_tokens += one.cached_prompt_tokens * u64::from(n);
    usage.completion_tokens += one.completion_tokens * u64::from(n);
    usage.hedged_calls += n;
}

/// Price one finished call's usage, settle its reservation to it and count it.
fn settle(prices: &Prices, backend: &str, usage: &mut Usage, (requested, reported): (&str, &str), hold: Option<Hold>) {
    prices.apply(usage, requested, reported);
    if usage.unpriced_calls == 0 && usage.cost_usd > 0.0 {
        usage.cost_by_backend = BTreeMap::from([(backend.to_string(), usage.cost_usd)]);
    }
    if let Some(hold) = hold {
        hold.settle(usage);
    }
    if usage.unpriced_calls == 0 && usage.cost_usd > 0.0 {
        let model = if requested.is_empty() { reported } else { requested };
        cost_counter().add(
            usage.cost_usd,
            &[
                KeyValue::new("assay.backend", backend.to_string()),
                KeyValue::new("gen_ai.request.model", model.to_string()),
            ],
        );
    }
}

/// A chat backend whose calls are priced and held to the work's budget.
pub struct PricedChat {
    inner: Arc<dyn ChatModel>,
    name: String,
    prices: Prices,
}

impl PricedChat {
    /// `inner`, configured as backend `name`, priced by `prices`.
    pub fn new(inner: Arc<dyn ChatModel>, name: &str, prices: Prices) -> PricedChat {
        PricedChat { inner, name: name.to_string(), prices }
    }
}

#[async_trait::async_trait]
impl ChatModel for PricedChat {
    fn backend(&self) -> &str {
        self.inner.backend()
    }

    fn default_model(&self) -> &str {
        self.inner.default_model()
    }

    fn supports_logprobs(&self) -> bool {
        self.inner.supports_logprobs()
    }

    fn structured_output(&self, model: &str) -> Option<&'static str> {
        self.inner.structured_output(model)
    }

    async fn context_tokens(&self, model: &str) -> Option<u32> {
        self.inner.context_tokens(model).await
    }

    async fn chat(&self, mut request: ChatRequest) -> Result<ChatResponse, LlmError> {
        let requested = request.model.clone().filter(|m| !m.is_empty());
        let requested = requested.unwrap_or_else(|| self.inner.default_model().to_string());
        let limited = assay_budget::current().is_some_and(|b| b.is_limited());
        if limited && request.max_tokens.is_none() {
            request.max_tokens = Some(DEFAULT_COMPLETION_LIMIT);
        }
        let completion = u64::from(request.max_tokens.unwrap_or(0));
        let price = self.prices.of(&requested, &requested);
        let prompt = chat_prompt_tokens(&request);
        let worst = worst_of(price, prompt, completion);
        let hold = reserve(worst, &requested, &self.name).await?;
        // An attempt given up on is counted at its worst case; without a completion limit (no
        // budget) at the default one.
        let limit = if completion > 0 { completion } else { u64::from(DEFAULT_COMPLETION_LIMIT) };
        let one = abandoned_attempt(&self.prices, &self.name, (prompt, limit), &requested);
        let ledger = Ledger::new(assay_budget::current(), worst, one, hold);
        let out = attempts::scope(ledger.clone(), self.inner.chat(request)).await;
        let mut reply = out?;
        let one = Usage { calls: 1, ..reply.usage.clone() };
        add_duplicates(&mut reply.usage, &one, ledger.duplicates());
        settle(&self.prices, &self.name, &mut reply.usage, (&requested, &reply.model), ledger.take_hold());
        reply.usage.add(&ledger.abandoned_usage());
        Ok(reply)
    }
}

/// An embedding backend whose calls are priced and held to the work's budget.
pub struct PricedEmbed {
    inner: Arc<dyn EmbeddingModel>,
    name: String,
    prices: Prices,
}

impl PricedEmbed {
    /// `inner`, configured as backend `name`, priced by `prices`.
    pub fn new(inner: Arc<dyn EmbeddingModel>, name: &str, prices: Prices) -> PricedEmbed {
        PricedEmbed { inner, name: name.to_string(), prices }
    }
}

#[async_trait::async_trait]
impl EmbeddingModel for PricedEmbed {
    fn backend(&self) -> &str {
        self.inner.backend()
    }

    fn default_model(&self) -> &str {
        self.inner.default_model()
    }

    async fn embed(&self, request: EmbeddingRequest) -> Result<EmbeddingResponse, LlmError> {
        let requested = request.model.clone().filter(|m| !m.is_empty());
        let requested = requested.unwrap_or_else(|| self.inner.default_model().to_string());
        let chars: usize = request.texts.iter().map(|t| t.chars().count()).sum();
        let prompt = prompt_tokens_of(chars) + 4 * request.texts.len() as u64;
        let worst = worst_of(self.prices.of(&requested, &requested), prompt, 0);
        let hold = reserve(worst, &requested, &self.name).await?;
        let one = abandoned_attempt(&self.prices, &self.name, (prompt, 0), &requested);
        let ledger = Ledger::new(assay_budget::current(), worst, one, hold);
        let mut reply = attempts::scope(ledger.clone(), self.inner.embed(request)).await?;
        let one = Usage { calls: 1, ..reply.usage.clone() };
        add_duplicates(&mut reply.usage, &one, ledger.duplicates());
        settle(&self.prices, &self.name, &mut reply.usage, (&requested, &reply.model), ledger.take_hold());
        reply.usage.add(&ledger.abandoned_usage());
        Ok(reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(prompt: u64, cached: u64, completion: u64) -> Usage {
        Usage {
            calls: 1,
            prompt_tokens: prompt,
            cached_prompt_tokens: cached,
            completion_tokens: completion,
            unpriced_calls: 1,
            ..Usage::default()
        }
    }

    #[test]
    fn cost_per_million_with_cached_input() {
        let p = Price { input: 0.15, output: 0.60, cached_input: Some(0.075) };
        // 1000 fresh + 1000 cached prompt tokens, 500 completion tokens.
        let c = p.cost(&usage(2000, 1000, 500));
        assert!((c - (1000.0 * 0.15 + 1000.0 * 0.075 + 500.0 * 0.60) / 1e6).abs() < 1e-15, "{c}");
        let no_cached_price = Price { cached_input: None, ..p };
        assert!((no_cached_price.cost(&usage(2000, 1000, 0)) - 2000.0 * 0.15 / 1e6).abs() < 1e-15);
    }

    #[test]
    fn an_unknown_model_stays_unpriced_and_a_star_prices_any() {
        let mut table = BTreeMap::new();
        table.insert("gpt-4o-mini".to_string(), Price { input: 1.0, output: 2.0, cached_input: None });
        let prices = Prices::new(table.clone());
        let mut u = usage(1_000_000, 0, 0);
        prices.apply(&mut u, "other", "other");
        assert_eq!((u.cost(), u.unpriced_calls), (None, 1));
        let mut u = usage(1_000_000, 0, 0);
        prices.apply(&mut u, "gpt-4o-mini", "gpt-4o-mini-2024-07-18");
        assert_eq!(u.cost(), Some(1.0));
        // The reported (dated) name is found when the requested one is not in the table.
        let mut u = usage(0, 0, 1_000_000);
        prices.apply(&mut u, "default", "gpt-4o-mini");
        assert_eq!(u.cost(), Some(2.0));
        table.insert("*".to_string(), Price::default());
        let mut u = usage(10, 0, 10);
        Prices::new(table).apply(&mut u, "anything", "anything");
        assert_eq!(u.cost(), Some(0.0));
    }
}
