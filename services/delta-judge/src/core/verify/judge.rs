//! The delta judge over a model hub: Verify (the heuristics, the issue checks and the quality
//! locks, every rejection reason named), CompareTexts, the consistency check and readability.

use std::sync::Arc;

use assay_domain::iteration;
use assay_domain::verify::{
    CompareOutcome, CompareRequest, ConsistencyOutcome, ConsistencyRequest, DEFAULT_MAX_LENGTH_RATIO, DeltaJudge,
    LockViolation, ReadabilityReport, VerifyOutcome, VerifyRequest,
};
use assay_domain::{ModelRecord, StageError, Usage, Violations};
use assay_llm::convergence::{Cascade, EmbeddingSource, EmbeddingUnavailable};
use assay_llm::{ModelHub, Purpose};
use futures::StreamExt;

use super::heuristics::{language_check, length_check};
use super::issues::{IssueResult, VERIFY_TEMPLATE, check_issue, issue_reason};
use super::readability_check::{readability_check, readability_input, report};
use super::structure::{restructuring, structure_check};
use crate::core::PHASE;
use crate::core::readability;

/// Issue checks of one request in flight at once.
pub const DEFAULT_CONCURRENCY: usize = 8;
/// Completion tokens of one YES/NO answer unless the phase sets its own.
const ANSWER_TOKENS: u32 = 16;

/// The delta judge's logic over a model hub.
pub struct DeltaJudgeCore {
    hub: Arc<ModelHub>,
    cascade: Cascade,
    concurrency: usize,
}

impl DeltaJudgeCore {
    pub fn new(hub: Arc<ModelHub>) -> Self {
        Self { hub, cascade: Cascade::new(), concurrency: DEFAULT_CONCURRENCY }
    }

    /// Use this cascade (e.g. one on a test clock).
    pub fn with_cascade(mut self, cascade: Cascade) -> Self {
        self.cascade = cascade;
        self
    }

    pub fn with_concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    pub fn cascade(&self) -> &Cascade {
        &self.cascade
    }
}

#[async_trait::async_trait]
impl DeltaJudge for DeltaJudgeCore {
    async fn verify(&self, request: VerifyRequest) -> Result<VerifyOutcome, StageError> {
        let mut v = Violations::new();
        request.check("", &mut v);
        v.into_result()?;
        let (before, after) = (&request.before.content, &request.after.content);
        let read_before = readability::measure(before);
        let read_after = readability::measure(after);
        let asked = restructuring(&request.issues);
        let grown = after.chars().count() as f64 > DEFAULT_MAX_LENGTH_RATIO * before.chars().count() as f64;
        let checks = [
            length_check(before, after, request.min_length_ratio, request.max_length_ratio),
            language_check(before, after),
            structure_check(before, after, asked.as_ref(), &request.issues),
            readability_check(&read_before, &read_after, asked.as_ref(), grown),
        ];
        let template_sha = assay_domain::template::template_sha256(VERIFY_TEMPLATE);
        let mut usage = Usage::default();
        let mut logprobs_unavailable = false;
        let mut issues = Vec::with_capacity(request.issues.len());
        let mut issue_reasons = Vec::new();
        let model = if request.issues.is_empty() {
            ModelRecord { phase: PHASE.into(), prompt_template_sha256: template_sha, ..ModelRecord::default() }
        } else {
            let chat = self.hub.chat(PHASE, &request.model, "model")?;
            let purpose = Purpose::new(ANSWER_TOKENS);
            let mut record = chat.record(PHASE, chat.max_tokens(purpose), template_sha, true);
            record.temperature = Some(record.temperature.unwrap_or(0.0));
            let (chat, req) = (&chat, &request);
            let results: Vec<IssueResult> = futures::stream::iter(0..request.issues.len())
                .map(|i| check_issue(chat, purpose, req, &req.issues[i]))
                .buffered(self.concurrency)
                .collect()
                .await;
            for r in results {
                usage.add(&r.usage);
                logprobs_unavailable |= r.logprobs_missing;
                issue_reasons.extend(issue_reason(&r));
                issues.push(r.verification);
            }
            record
        };
        let lock_violations: Vec<LockViolation> = iteration::lock_violations(&request.locks, &request.criterion_scores);

        let mut rejection_reasons: Vec<String> = checks.iter().filter_map(|c| c.reason.clone()).collect();
        rejection_reasons.extend(issue_reasons);
        let notes: Vec<String> = checks.iter().filter_map(|c| c.note.clone()).collect();
        rejection_reasons.extend(
            lock_violations
                .iter()
                .map(|l| format!("lock {} dropped {:.2} > {:.2}", l.criterion, l.baseline - l.current, l.max_drop)),
        );
        Ok(VerifyOutcome {
            heuristics: checks.into_iter().map(|c| c.check).collect(),
            issues,
            lock_violations,
            accepted: rejection_reasons.is_empty(),
            notes,
            readability: report(&read_after),
            usage,
            model,
            rejection_reasons,
            logprobs_unavailable,
        })
    }

    async fn compare_texts(&self, request: CompareRequest) -> Result<CompareOutcome, StageError> {
        let mut v = Violations::new();
        request.check("", &mut v);
        v.into_result()?;
        let source = match self.hub.embedding(PHASE, &request.embedding_model, "embedding_model") {
            Ok((model, settings)) => Ok(EmbeddingSource { model, model_name: settings.model, deadline: None }),
            // A backend the caller named must exist; a missing configured one only degrades.
            Err(e) if request.embedding_model.backend.is_some() => return Err(e),
            Err(e) => Err(EmbeddingUnavailable::NoBackend(e)),
        };
        let source = source.as_ref().map_err(Clone::clone);
        Ok(self.cascade.compare(&request.previous, &request.current, request.mode, source).await)
    }

    async fn check_consistency(&self, request: ConsistencyRequest) -> Result<ConsistencyOutcome, StageError> {
        crate::core::consistency::check(&self.hub, request).await
    }

    async fn readability(&self, text: String) -> Result<ReadabilityReport, StageError> {
        readability_input(&text)?;
        Ok(report(&readability::measure(&text)))
    }
}
