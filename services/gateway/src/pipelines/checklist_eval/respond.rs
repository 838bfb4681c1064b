//! Responders: models under test in a checklist evaluation. Each answers every record (its input
//! through the responder's template, `samples` times); each answer becomes a target scored
//! against the record's checklist, one checklist per distinct input shared by every responder (a
//! checklist's key ignores the target), so the comparison is paired and generation is paid once.
//! Responses are checkpointed per (record, responder): a resumed run asks only what is missing,
//! and the response cache makes a re-run with one more responder ask only that one. The result
//! carries each responder's aggregate and answering cost, and each responder after the first
//! compared with the first as CompareRuns compares two runs.

use std::collections::HashMap;

use assay_domain::generator::RespondRequest;
use assay_domain::stats::DEFAULT_BOOTSTRAP_SEED;
use assay_domain::stats::runs::{self, CompareOptions, RunMetric};
use assay_domain::{AggregateScores, Checklist, StageError, Usage, Violations};
use assay_proto::convert;
use assay_proto::gateway::v1 as gw;
use futures::StreamExt;

use super::super::checklist::EvalRecord;
use super::super::responders::{Answered, Derived, key, label, layout, render};
use super::ChecklistEval;
use assay_runs::RunCtx;

impl ChecklistEval {
    /// Ask every responder about every record not answered yet (stored answers are read back),
    /// `concurrency` calls at once: the records to score (one per target of [`layout`], the
    /// response as its target), why targets cannot be scored (their responder failed), and each
    /// responder's answering cost.
    pub(super) async fn respond_all(&self, ctx: &RunCtx) -> Result<Derived, StageError> {
        let generator = self.stages.generator()?;
        let mut answered: HashMap<String, Answered> = HashMap::new();
        let pairs: Vec<(usize, usize)> =
            (0..self.records.len()).flat_map(|i| (0..self.responders.len()).map(move |j| (i, j))).collect();
        for (i, j) in &pairs {
            if let Some(a) = ctx.checkpoints.load_json::<Answered>(&key(*i, *j)).await? {
                answered.insert(key(*i, *j), a);
            }
        }
        let missing: Vec<(usize, usize)> =
            pairs.iter().copied().filter(|(i, j)| !answered.contains_key(&key(*i, *j))).collect();
        let mut calls = futures::stream::iter(missing.into_iter().map(|(i, j)| {
            let r = &self.responders[j];
            let request = RespondRequest {
                model: r.model.clone(),
                system_prompt: r.system_prompt.clone(),
                prompt: render(&r.template, &self.records[i], i),
                samples: r.samples,
            };
            async move {
                ctx.gate.wait().await?;
                Ok::<_, StageError>((i, j, generator.respond(request, &assay_domain::no_events).await))
            }
        }))
        .buffer_unordered(self.concurrency);
        while let Some(next) = calls.next().await {
            let (i, j, out) = next?;
            let a = match out {
                Ok(out) => {
                    ctx.spending.add_usage(&out.usage);
                    ctx.progress.add_model(&out.model);
                    Answered { responses: out.responses, error: String::new(), usage: out.usage }
                }
                Err(
                    e @ (StageError::InvalidArgument(_)
                    | StageError::FailedPrecondition(_)
                    | StageError::Unimplemented(_)
                    | StageError::Cancelled(_)),
                ) => {
                    return Err(e.map_fields(|f| format!("pipeline.responders[{j}].{f}")));
                }
                Err(StageError::BudgetExhausted(why)) => {
                    Answered { error: format!("not run: {}", why.message), ..Default::default() }
                }
                Err(e) => Answered {
                    error: format!("responder {} failed: {e}", self.responders[j].name),
                    ..Default::default()
                },
            };
            ctx.checkpoints.put_json(&key(i, j), &a).await?;
            answered.insert(key(i, j), a);
        }
        drop(calls);
        let mut d = Derived { usage: vec![Usage::default(); self.responders.len()], ..Default::default() };
        for (t, (i, j, s)) in layout(self.records.len(), &self.responders).into_iter().enumerate() {
            let a = answered.get(&key(i, j));
            if let Some(a) = a {
                if s == 0 {
                    d.usage[j].add(&a.usage);
                }
                if !a.error.is_empty() {
                    d.failures.insert(t, a.error.clone());
                }
            }
            let response = a.and_then(|a| a.responses.get(s as usize)).cloned().unwrap_or_default();
            if response.trim().is_empty() && !d.failures.contains_key(&t) {
                d.failures.insert(t, format!("responder {} gave an empty response", self.responders[j].name));
            }
            d.targets.push(EvalRecord { id: self.records[i].id_or(i), target: response, ..self.records[i].clone() });
        }
        Ok(d)
    }

    /// Each result named by its responder and sample, with the response; each responder's
    /// aggregate and cost; each responder after the first compared with the first.
    pub(super) fn annotate(&self, result: &mut gw::EvaluateResponse, derived: &Derived) {
        let usage = &derived.usage;
        for r in &mut result.results {
            label(r, &self.responders, self.records.len(), derived);
        }
        let checklists: Vec<Checklist> = result
            .checklists
            .iter()
            .map(|c| convert::checklist(Some(c.clone()), "checklist", &mut Violations::new()))
            .collect();
        let of = |j: usize| -> Vec<gw::RecordResult> {
            result.results.iter().filter(|r| r.responder == self.responders[j].name).cloned().collect()
        };
        let mut summaries = Vec::new();
        for (j, r) in self.responders.iter().enumerate() {
            let mine = of(j);
            let scored: Vec<(assay_domain::Score, &Checklist)> = mine
                .iter()
                .filter_map(|x| {
                    let cl = checklists.iter().find(|c| c.id == x.checklist_id)?;
                    Some((convert::score_from(x.score.clone()?), cl))
                })
                .collect();
            let aggregate = AggregateScores::compute(scored.iter().map(|(s, c)| (s, *c)));
            summaries.push(gw::ResponderResult {
                name: r.name.clone(),
                model: Some(convert::model_spec_to(&r.model)),
                template: r.template.clone(),
                aggregate: Some(convert::aggregate_to(&aggregate)),
                usage: Some(convert::usage_to(&usage.get(j).cloned().unwrap_or_default())),
                responses: mine.len() as u32,
                failed: mine.iter().filter(|x| x.score.is_none()).count() as u32,
            });
        }
        let subset = |j: usize| gw::EvaluateResponse { results: of(j), ..Default::default() };
        let baseline = runs_of(&subset(0));
        let mut comparisons = Vec::new();
        for j in 1..self.responders.len() {
            let options = CompareOptions {
                metric: RunMetric::Primary,
                alpha: 0.05,
                seed: DEFAULT_BOOTSTRAP_SEED,
                min_effect: Some(0.0),
            };
            match runs::compare_runs(&baseline, &runs_of(&subset(j)), options) {
                Ok(report) => comparisons.push(convert::runs::comparison_to(
                    self.responders[0].name.clone(),
                    self.responders[j].name.clone(),
                    &report,
                )),
                Err(e) => tracing::warn!(responder = %self.responders[j].name, error = %e, "responders not compared"),
            }
        }
        result.responders = summaries;
        result.comparisons = comparisons;
    }
}

fn runs_of(e: &gw::EvaluateResponse) -> runs::RunResults {
    convert::runs::run_results(e, RunMetric::Primary)
}
