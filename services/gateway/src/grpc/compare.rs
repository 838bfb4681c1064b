//! `CompareRuns`: two stored checklist_eval runs read through the engine (as GetRun reads them),
//! turned into [`RunResults`] and compared by the core `assay compare` uses
//! ([`assay_domain::stats::runs`]), so a comparison by run id and one of the runs' `--out` files
//! give the same numbers.

use assay_domain::stats::DEFAULT_BOOTSTRAP_SEED;
use assay_domain::stats::StatsError;
use assay_domain::stats::runs::{self, CompareOptions, RunCompareError, RunMetric};
use assay_domain::{StageError, Violations};
use assay_proto::gateway::v1 as gw;
use assay_proto::pipelines::{self, PipelineContract, result_of};

use assay_proto::convert::runs::run_results;

use assay_runs::Engine;

/// The significance level when the request gives 0.
const DEFAULT_ALPHA: f64 = 0.05;

/// A request checked at the edge.
struct Parsed {
    baseline: String,
    candidate: String,
    options: CompareOptions,
}

fn metric_of(m: gw::CompareMetric) -> RunMetric {
    match m {
        gw::CompareMetric::Unspecified | gw::CompareMetric::Primary => RunMetric::Primary,
        gw::CompareMetric::PassRate => RunMetric::PassRate,
        gw::CompareMetric::Weighted => RunMetric::Weighted,
        gw::CompareMetric::Normalized => RunMetric::Normalized,
    }
}

fn parse(req: gw::CompareRunsRequest) -> Result<Parsed, StageError> {
    let gw::CompareRunsRequest { baseline_run_id, candidate_run_id, metric, alpha, min_effect, bootstrap_seed } = req;
    let mut v = Violations::new();
    for (field, id) in [("baseline_run_id", &baseline_run_id), ("candidate_run_id", &candidate_run_id)] {
        if id.is_empty() {
            v.push(field, "must not be empty");
        }
    }
    let metric = match gw::CompareMetric::try_from(metric) {
        Ok(m) => metric_of(m),
        Err(_) => {
            v.push("metric", format!("unknown enum value {metric}"));
            RunMetric::Primary
        }
    };
    let alpha = if alpha == 0.0 { DEFAULT_ALPHA } else { alpha };
    if !(alpha > 0.0 && alpha < 1.0) {
        v.push("alpha", format!("must be in (0, 1) (0 = {DEFAULT_ALPHA}), got {alpha}"));
    }
    if let Some(m) = min_effect
        && !(m.is_finite() && m >= 0.0)
    {
        v.push("min_effect", format!("must be a finite number >= 0, got {m}"));
    }
    v.into_result()?;
    Ok(Parsed {
        baseline: baseline_run_id,
        candidate: candidate_run_id,
        options: CompareOptions { metric, alpha, seed: bootstrap_seed.unwrap_or(DEFAULT_BOOTSTRAP_SEED), min_effect },
    })
}

/// A stored run's evaluation: NOT_FOUND for an unknown id; FAILED_PRECONDITION naming the run and
/// its kind or state unless it is a checklist_eval run that SUCCEEDED or ended PARTIAL.
async fn evaluation(engine: &Engine, side: &str, run_id: &str) -> Result<gw::EvaluateResponse, StageError> {
    let run = engine.get(run_id).await;
    if let Err(StageError::NotFound(_)) = &run {
        return Err(StageError::NotFound(format!("{side} run {run_id}")));
    }
    let run = run?;
    let kind = gw::PipelineKind::try_from(run.kind).unwrap_or(gw::PipelineKind::Unspecified);
    let state = gw::RunState::try_from(run.state).unwrap_or(gw::RunState::Unspecified);
    if kind != pipelines::ChecklistEval::KIND {
        return Err(StageError::FailedPrecondition(format!(
            "{side} run {run_id} is a {} run; CompareRuns compares checklist_eval runs",
            kind.as_str_name().trim_start_matches("PIPELINE_KIND_").to_ascii_lowercase()
        )));
    }
    if !matches!(state, gw::RunState::Succeeded | gw::RunState::Partial) {
        return Err(StageError::FailedPrecondition(format!(
            "{side} run {run_id} is in state {}; CompareRuns compares runs that SUCCEEDED or ended PARTIAL",
            state.as_str_name().trim_start_matches("RUN_STATE_")
        )));
    }
    let mut e = result_of::<pipelines::ChecklistEval>(run.result)
        .ok_or_else(|| StageError::FailedPrecondition(format!("{side} run {run_id} holds no evaluation result")))?;
    crate::pipelines::checklist_eval::complete_paged(engine, &mut e).await?;
    Ok(e)
}

/// Compare the request's two runs.
pub async fn compare_runs(engine: &Engine, req: gw::CompareRunsRequest) -> Result<gw::CompareRunsResponse, StageError> {
    let Parsed { baseline, candidate, options } = parse(req)?;
    let base = evaluation(engine, "baseline", &baseline).await?;
    let cand = evaluation(engine, "candidate", &candidate).await?;
    let (b, c) = (run_results(&base, options.metric), run_results(&cand, options.metric));
    let report = runs::compare_runs(&b, &c, options).map_err(|e| match e {
        RunCompareError::NoSharedRecords { .. } => {
            StageError::FailedPrecondition(format!("runs {baseline} and {candidate}: {e}"))
        }
        RunCompareError::Stats(StatsError::Alpha(a)) => {
            StageError::invalid("alpha", format!("must be in (0, 1), got {a}"))
        }
        RunCompareError::Stats(s @ (StatsError::TooFew { .. } | StatsError::NotFinite(_))) => {
            StageError::FailedPrecondition(format!("runs {baseline} and {candidate}: cannot compare: {s}"))
        }
    })?;
    Ok(assay_proto::convert::runs::comparison_to(baseline, candidate, &report))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_alpha_metric_min_effect_and_empty_ids_are_named() {
        let req = gw::CompareRunsRequest {
            baseline_run_id: String::new(),
            candidate_run_id: "b".into(),
            metric: 99,
            alpha: 1.5,
            min_effect: Some(-0.1),
            bootstrap_seed: None,
        };
        let Err(StageError::InvalidArgument(v)) = parse(req) else { panic!("invalid") };
        let fields: Vec<&str> = v.iter().map(|f| f.field.as_str()).collect();
        assert_eq!(fields, ["baseline_run_id", "metric", "alpha", "min_effect"]);
    }

    #[test]
    fn zero_alpha_is_the_default_and_the_seed_defaults() {
        let req =
            gw::CompareRunsRequest { baseline_run_id: "a".into(), candidate_run_id: "b".into(), ..Default::default() };
        let p = parse(req).unwrap_or_else(|_| panic!("valid"));
        assert_eq!(p.options.alpha, 0.05);
        assert_eq!(p.options.seed, DEFAULT_BOOTSTRAP_SEED);
        assert_eq!(p.options.metric, RunMetric::Primary);
        assert_eq!(p.options.min_effect, None);
    }
}
