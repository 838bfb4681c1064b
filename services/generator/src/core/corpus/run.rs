//! One corpus run: the resolved model, the request, the progress sink and the usage of every call
//! so far; the structured call every preset stage makes.

use std::sync::Mutex;

use assay_domain::generator::corpus::{CorpusProgress, CorpusRequest};
use assay_domain::{ChecklistItem, EventSink, StageError, Usage};
use assay_llm::json::{preview, reply_json};
use assay_llm::{ChatRequest, Message, Purpose, ResolvedChat, ResponseFormat};

use crate::core::parse::PREVIEW_CHARS;
use serde_json::Value;

/// One corpus run: the resolved model, settings and the usage of every call so far.
pub(crate) struct Run<'a> {
    pub chat: ResolvedChat,
    pub request: &'a CorpusRequest,
    pub concurrency: usize,
    pub events: EventSink<'a, CorpusProgress>,
    pub(crate) usage: Mutex<Usage>,
    /// Bounds the run's concurrent model calls, however the stages nest.
    pub(crate) permits: tokio::sync::Semaphore,
}

impl<'a> Run<'a> {
    pub fn emit(&self, stage: &str, done: u32, total: u32, message: impl Into<String>) {
        (self.events)(CorpusProgress::new(stage, done, total, message));
    }

    pub fn add_usage(&self, u: &Usage) {
        self.usage.lock().unwrap_or_else(|p| p.into_inner()).add(u);
    }

    pub fn usage(&self) -> Usage {
        self.usage.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Generation temperature of this run.
    pub fn temperature(&self) -> f64 {
        self.request.effective_temperature()
    }

    /// One structured call: the prompt as the only user message, a JSON schema, the temperature
    /// given; returns the reply's JSON value, `None` when the reply holds none.
    pub async fn call_value(
        &self,
        what: &str,
        prompt: String,
        schema: Value,
        temperature: f64,
        max_tokens: u32,
    ) -> Result<(Option<Value>, String), StageError> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| StageError::Internal("the call limiter of the corpus run was closed".into()))?;
        let chat = &self.chat;
        let req = ChatRequest {
            response_format: ResponseFormat::JsonSchema { name: what.replace(' ', "_"), schema },
            ..chat.request(vec![Message::user(prompt)], Purpose::new(max_tokens).chosen_temperature(temperature))
        };
        let reply = chat.model.chat(req).await?;
        self.add_usage(&reply.usage);
        let value = reply_json(&reply);
        Ok((value, reply.text))
    }

    /// [`Run::call_value`], where a reply without JSON is UNAVAILABLE naming `what`.
    pub async fn call_json(
        &self,
        what: &str,
        prompt: String,
        schema: Value,
        temperature: f64,
        max_tokens: u32,
    ) -> Result<Value, StageError> {
        let (value, text) = self.call_value(what, prompt, schema, temperature, max_tokens).await?;
        value.ok_or_else(|| {
            StageError::Unavailable(format!(
                "the {what} reply of preset {} holds no JSON value (reply starts with {:?})",
                self.request.preset,
                preview(&text, PREVIEW_CHARS)
            ))
        })
    }
}

/// What a preset's generation stage produced, before built-in refinement.
pub(crate) struct Generated {
    pub items: Vec<ChecklistItem>,
    /// Questions the model produced before any filtering or refinement.
    pub raw_questions: u32,
    /// Checklist metadata the stage reports.
    pub metadata: Vec<(String, String)>,
    /// Max tokens of the main generation call (for the model record).
    pub max_tokens: u32,
}
