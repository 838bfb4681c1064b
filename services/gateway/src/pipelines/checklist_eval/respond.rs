//! Responders: models under test in a checklist evaluation. Each answers every record (its input
//! through the responder's template, `samples` times); each answer becomes a target scored
//! against the record's checklist, one checklist per distinct input shared by every responder (a
//! checklist's key ignores the target), so the comparison is paired and generation is paid once.
//! A (record, responder) is asked when its first target is scored, so answering and judging go
//! record by record together: a budget that runs out leaves the records before it answered and
//! judged by every responder, and names the pairs it did not reach. Answers are checkpointed per
//! (record, responder): a resumed run asks only what is missing, and the response cache makes a
//! re-run with one more responder ask only that one. The result carries each responder's
//! aggregate, answering cost and missing records, and each responder after the first compared
//! with the first as CompareRuns compares two runs.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use assay_domain::generator::RespondRequest;
use assay_domain::stats::DEFAULT_BOOTSTRAP_SEED;
use assay_domain::stats::runs::{self, CompareOptions, RunMetric};
use assay_domain::{AggregateScores, Checklist, ModelRecord, ScorerSettings, StageError, Usage, Violations};
use assay_proto::convert;
use assay_proto::gateway::v1 as gw;

use super::super::checklist::EvalRecord;
use super::super::responders::{AnswerCell, Answered, RESPONSE, key, render, target_of};
use super::ChecklistEval;
use assay_runs::RunCtx;

impl ChecklistEval {
    /// Target `t` (of `record`, its id set) answered by its responder through `cell` (asked now
    /// unless it was already, by another sample of the pair or before a restart) and scored; and what answering cost now, if this target asked. A responder that
    /// failed or was refused by the budget fails the target (the inner result); a request the
    /// generator refused fails the run (the outer one).
    #[allow(clippy::type_complexity, clippy::too_many_arguments)]
    pub(super) async fn answer_and_score(
        &self,
        ctx: &RunCtx,
        cell: &AnswerCell,
        record: &EvalRecord,
        checklist: &Checklist,
        config: &ScorerSettings,
        t: usize,
    ) -> Result<(Usage, Result<(gw::RecordResult, Usage, ModelRecord), StageError>), StageError> {
        let Some((i, j, s)) = target_of(t, &self.responders) else {
            return Err(StageError::Internal(format!("target {t} has no responder")));
        };
        let mut paid = Usage::default();
        let answered = cell
            .get_or_try_init(|| async {
                if let Some(a) = ctx.checkpoints.load_json::<Answered>(&key(i, j)).await? {
                    return Ok(Ok(a));
                }
                let generator = self.stages.generator()?;
                let r = &self.responders[j];
                let request = RespondRequest {
                    model: r.model.clone(),
                    system_prompt: r.system_prompt.clone(),
                    prompt: render(&r.template, record, i),
                    samples: r.samples,
                };
                match generator.respond(request, &assay_domain::no_events).await {
                    Ok(out) => {
                        ctx.spending.add_usage(&out.usage);
                        ctx.progress.add_model(&out.model);
                        let a = Answered { responses: out.responses, error: String::new(), usage: out.usage };
                        ctx.checkpoints.put_json(&key(i, j), &a).await?;
                        paid = a.usage.clone();
                        Ok(Ok(a))
                    }
                    Err(
                        e @ (StageError::InvalidArgument(_)
                        | StageError::FailedPrecondition(_)
                        | StageError::Unimplemented(_)
                        | StageError::Cancelled(_)),
                    ) => Err(e.map_fields(|f| format!("pipeline.responders[{j}].{f}"))),
                    Err(e @ StageError::BudgetExhausted(_)) => Ok(Err(e)),
                    Err(e) => Ok(Err(StageError::Unavailable(format!("responder {} failed: {e}", r.name)))),
                }
            })
            .await?;
        let response = match answered {
            Ok(a) => a.responses.get(s as usize).cloned().unwrap_or_default(),
            Err(e) => return Ok((paid, Err(e.clone()))),
        };
        if response.trim().is_empty() {
            let why = format!("responder {} gave an empty response", self.responders[j].name);
            return Ok((paid, Err(StageError::Unavailable(why))));
        }
        let target = EvalRecord { target: response, ..record.clone() };
        Ok((paid, self.score_record(checklist, config, t, &target).await))
    }

    /// Each responder's aggregate and answering cost (from the answers the run stored), and each
    /// responder after the first compared with the first, over a run's labelled results.
    /// `ids`: the records the run asked, in the request's order.
    pub(super) async fn annotate(
        &self,
        ctx: &RunCtx,
        result: &mut gw::EvaluateResponse,
        ids: &[String],
    ) -> Result<(), StageError> {
        let checklists: Vec<Arc<Checklist>> = result
            .checklists
            .iter()
            .map(|c| Arc::new(convert::checklist(Some(c.clone()), "checklist", &mut Violations::new())))
            .collect();
        let checklist_of = |r: &gw::RecordResult| checklists.iter().find(|c| c.id == r.checklist_id).cloned();
        let usage = answering_usage(ctx, self.responders.len()).await?;
        let (summaries, comparisons) = self.verdict(&result.results, checklist_of, &usage, ids);
        result.responders = summaries;
        result.comparisons = comparisons;
        Ok(())
    }

    /// From a run's labelled results (`checklist_of` each one's checklist), what answering cost
    /// per responder and the run's record ids in order: each responder's summary, and each one
    /// after the first compared with the first on the records both have (as CompareRuns would).
    pub(super) fn verdict(
        &self,
        results: &[gw::RecordResult],
        checklist_of: impl Fn(&gw::RecordResult) -> Option<Arc<Checklist>>,
        usage: &[Usage],
        ids: &[String],
    ) -> (Vec<gw::ResponderResult>, Vec<gw::CompareRunsResponse>) {
        let of = |j: usize| -> Vec<gw::RecordResult> {
            results.iter().filter(|r| r.responder == self.responders[j].name).cloned().collect()
        };
        let mut summaries = Vec::new();
        for (j, r) in self.responders.iter().enumerate() {
            let mine = of(j);
            let judged: Vec<(assay_domain::Score, Arc<Checklist>)> =
                mine.iter().filter_map(|x| Some((convert::score_from(x.score.clone()?), checklist_of(x)?))).collect();
            let aggregate = AggregateScores::compute(judged.iter().map(|(s, c)| (s, c.as_ref())));
            // Scored: some item answered (an unparseable judge reply scores nothing, never a zero).
            let scored = |x: &&gw::RecordResult| x.score.as_ref().is_some_and(|s| s.answered_count > 0);
            let have: HashSet<&str> = mine.iter().filter(scored).map(|x| x.record_id.as_str()).collect();
            let missing: Vec<String> = ids.iter().filter(|id| !have.contains(id.as_str())).cloned().collect();
            summaries.push(gw::ResponderResult {
                name: r.name.clone(),
                model: Some(convert::model_spec_to(&r.model)),
                template: r.template.clone(),
                // A responder with no scored response is unscored: no mean (0 would read as a
                // score), and it is compared with nothing.
                aggregate: (!have.is_empty()).then(|| convert::aggregate_to(&aggregate)),
                usage: Some(convert::usage_to(&usage.get(j).cloned().unwrap_or_default())),
                responses: mine.len() as u32,
                failed: mine.iter().filter(|x| x.score.is_none()).count() as u32,
                missing,
            });
        }
        let subset = |j: usize| gw::EvaluateResponse { results: of(j), ..Default::default() };
        let baseline = runs_of(&subset(0));
        let mut comparisons = Vec::new();
        for j in 1..self.responders.len() {
            if summaries[0].aggregate.is_none() || summaries[j].aggregate.is_none() {
                continue;
            }
            let options = CompareOptions {
                metric: RunMetric::Primary,
                alpha: 0.05,
                seed: DEFAULT_BOOTSTRAP_SEED,
                min_effect: Some(0.0),
            };
            match runs::compare_complete(&baseline, &runs_of(&subset(j)), options) {
                Ok(report) => comparisons.push(convert::runs::comparison_to(
                    self.responders[0].name.clone(),
                    self.responders[j].name.clone(),
                    &report,
                )),
                Err(e) => tracing::warn!(responder = %self.responders[j].name, error = %e, "responders not compared"),
            }
        }
        (summaries, comparisons)
    }
}

/// The answers of an open run's records in flight, per (record, responder): shared by the pair's
/// samples, dropped once every sample is settled.
#[derive(Default)]
pub(super) struct InFlight(std::sync::Mutex<Pairs>);

/// Per (record, responder) in flight: its answer cell and how many of its samples are settled.
type Pairs = HashMap<(usize, usize), (Arc<AnswerCell>, u32)>;

impl InFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pairs> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The answer cell of (record `i`, responder `j`).
    pub(super) fn cell(&self, i: usize, j: usize) -> Arc<AnswerCell> {
        self.lock().entry((i, j)).or_default().0.clone()
    }

    /// One of the pair's `samples` settled: its response (if answered), the cell dropped after the
    /// last.
    pub(super) fn settled(&self, i: usize, j: usize, s: u32, samples: u32) -> Option<String> {
        let mut map = self.lock();
        let entry = map.get_mut(&(i, j))?;
        let response = match entry.0.get() {
            Some(Ok(a)) => a.responses.get(s as usize).cloned(),
            Some(Err(_)) | None => None,
        };
        entry.1 += 1;
        if entry.1 >= samples {
            map.remove(&(i, j));
        }
        response
    }
}

/// Each responder's answering cost, over the answers the run stored (a page at a time).
pub(super) async fn answering_usage(ctx: &RunCtx, responders: usize) -> Result<Vec<Usage>, StageError> {
    let mut usage = vec![Usage::default(); responders];
    let mut after = String::new();
    loop {
        let page = ctx.checkpoints.page_json::<Answered>(RESPONSE, &after, 256).await?;
        let Some((last, _)) = page.last() else { break };
        after.clone_from(last);
        for (k, a) in page {
            if let Some(j) = k.rsplit(':').next().and_then(|j| j.parse::<usize>().ok()).filter(|j| *j < responders) {
                usage[j].add(&a.usage);
            }
        }
    }
    Ok(usage)
}

fn runs_of(e: &gw::EvaluateResponse) -> runs::RunResults {
    convert::runs::run_results(e, RunMetric::Primary)
}
