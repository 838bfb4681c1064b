//! The panel: every judge's model resolved, then one call per judge, concurrently, each reply
//! parsed into a verdict or a failure with its reason.

use assay_domain::document::{Criterion, JudgeVerdict, Section};
use assay_domain::judge::{
    JUDGE_PHASE, JudgeEvent, JudgeResult, JudgeSectionsRequest, PanelJudge, PanelOutcome, SectionJudge,
    panel_or_default,
};
use assay_domain::{EventSink, ModelRecord, StageError, Usage};
use assay_llm::json::reply_json;
use assay_llm::{ChatRequest, ChatResponse, Message, Purpose, ResolvedChat, ResponseFormat};
use futures::StreamExt;
use serde_json::Value;

use super::parse::{ParsedVerdict, parse_verdict_with_context};
use super::prompt::{FOCUSED_TEMPLATE, TEMPLATE, render_focused_prompt, render_prompt};
use super::schema::{default_max_tokens, focused_max_tokens, focused_reply_schema, reply_schema};
use crate::core::ScorerCore;

/// Configuration phase the judges resolve their models for.
pub const PHASE: &str = JUDGE_PHASE;

#[async_trait::async_trait]
impl SectionJudge for ScorerCore {
    async fn judge_sections(
        &self,
        request: JudgeSectionsRequest,
        events: EventSink<'_, JudgeEvent>,
    ) -> Result<PanelOutcome, StageError> {
        let request = JudgeSectionsRequest { judges: panel_or_default(request.judges), ..request };
        request.check()?;
        // Every judge's model is resolved before any call: an unknown backend is the caller's
        // error and costs nothing.
        let chats = request
            .judges
            .iter()
            .enumerate()
            .map(|(i, j)| self.hub.chat(PHASE, &j.model, &format!("judges[{i}].model")))
            .collect::<Result<Vec<_>, _>>()?;
        let (sections, criteria) = (&request.sections, &request.criteria);
        let job = if request.context.is_empty() {
            Panel {
                prompt: render_prompt(&request.brief, criteria, sections),
                schema: reply_schema(criteria, sections),
                template_sha256: assay_domain::template::template_sha256(TEMPLATE),
                max_tokens: default_max_tokens(sections.len(), criteria.len()),
                sections,
                context: &[],
                criteria,
            }
        } else {
            Panel {
                prompt: render_focused_prompt(&request.brief, criteria, sections, &request.context),
                schema: focused_reply_schema(criteria, sections),
                template_sha256: assay_domain::template::template_sha256(FOCUSED_TEMPLATE),
                max_tokens: focused_max_tokens(sections.len(), criteria.len()),
                sections,
                context: &request.context,
                criteria,
            }
        };
        let job = &job;
        let n = request.judges.len();
        let mut results: Vec<Option<JudgeResult>> = vec![None; n];
        let (judges, chats) = (&request.judges, &chats);
        let mut running = futures::stream::iter(0..n)
            .map(|i| async move { (i, job.run(&judges[i], &chats[i]).await) })
            .buffer_unordered(n.max(1));
        while let Some((i, result)) = running.next().await {
            events(JudgeEvent::JudgeFinished { index: i as u32, result: result.clone() });
            results[i] = Some(result);
        }
        drop(running);
        Ok(PanelOutcome::from_results(results.into_iter().flatten().collect()))
    }
}

/// What every judge of one request shares.
struct Panel<'a> {
    prompt: String,
    schema: Value,
    template_sha256: String,
    max_tokens: u32,
    sections: &'a [Section],
    /// Read-only context of a focused judging (empty otherwise).
    context: &'a [Section],
    criteria: &'a [Criterion],
}

impl Panel<'_> {
    /// One judge: one call, then the parse. Never an error: failures are in the result.
    async fn run(&self, judge: &PanelJudge, chat: &ResolvedChat) -> JudgeResult {
        let purpose = Purpose::new(self.max_tokens);
        let max_tokens = chat.max_tokens(purpose);
        // The judge's own temperature wins over the phase's; unset everywhere means 0. The record
        // keeps the caller's exact value (the wire request carries it as f32).
        let temperature = judge.model.temperature.or(chat.settings.temperature.map(f64::from)).unwrap_or(0.0);
        let mut record: ModelRecord = chat.record(PHASE, max_tokens, self.template_sha256.clone(), false);
        record.temperature = Some(temperature);
        let model = chat.model_name();
        let req = ChatRequest {
            response_format: ResponseFormat::JsonSchema { name: "section_verdict".into(), schema: self.schema.clone() },
            ..chat.request(vec![Message::user(self.prompt.clone())], purpose)
        };
        let failed = |error: String, usage: Usage| {
            tracing::info!(judge = %judge.id, model = %model, error = %error, "judge failed");
            JudgeResult { judge_id: judge.id.clone(), verdict: None, error, usage, model_record: Some(record.clone()) }
        };
        let reply: ChatResponse = match chat.model.chat(req).await {
            Ok(r) => r,
            // The backend gave no accounting for a failed call: its usage stays zero.
            Err(e) => return failed(format!("model call failed: {e}"), Usage::default()),
        };
        let Some(value) = reply_json(&reply) else {
            return failed("the reply holds no JSON object".into(), reply.usage);
        };
        match parse_verdict_with_context(&value, &judge.id, self.sections, self.context, self.criteria) {
            Ok(parsed) => {
                let ParsedVerdict { criterion_scores, issues, section_scores, unknown_section_issues, notes } = parsed;
                let overall_score = assay_domain::document::mean_score(&criterion_scores);
                let verdict = JudgeVerdict {
                    judge_id: judge.id.clone(),
                    model,
                    criterion_scores,
                    issues,
                    overall_score,
                    section_scores,
                    usage: reply.usage.clone(),
                    model_record: Some(record.clone()),
                    unknown_section_issues,
                };
                JudgeResult {
                    judge_id: judge.id.clone(),
                    verdict: Some(verdict),
                    error: notes.join("; "),
                    usage: reply.usage,
                    model_record: Some(record),
                }
            }
            Err(why) => failed(why.0, reply.usage),
        }
    }
}
