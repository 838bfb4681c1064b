//! Parsing and validation of a targeted refinement request (fields named `pipeline.*`).

use std::sync::Mutex as StdMutex;
use std::time::{Duration, Instant};

use assay_domain::document::{MAX_JUDGES, check_criteria, default_criteria};
use assay_domain::iteration::{self, DEFAULT_LOCK_THRESHOLD, Limits, Mode};
use assay_domain::judge::{PanelJudge, check_judges, panel_or_default};
use assay_domain::{JudgeVerdict, Section, StageError, Violations};
use assay_proto::convert;
use assay_proto::gateway::v1 as gw;
use tokio::sync::Mutex;

use super::{Clock, Models, TargetedRefinement};
use crate::pipelines::stages::Stages;

/// Bounds of the per-request limits.
const MAX_ITERATIONS: u32 = 10;
const TOKEN_BUDGET: (u64, u64) = (1_000, 10_000_000);
const TIME_BUDGET_SECONDS: (u32, u32) = (1, 86_400);

fn field(name: &str) -> String {
    format!("pipeline.{name}")
}

impl TargetedRefinement {
    /// Parse and validate (fields named `pipeline.*`).
    pub fn parse(p: gw::TargetedRefinementPipeline, stages: Stages) -> Result<Self, StageError> {
        let gw::TargetedRefinementPipeline {
            sections,
            verdicts,
            judges,
            mode,
            max_iterations,
            token_budget,
            time_budget_seconds,
            patcher_model,
            expander_model,
            delta_judge_model,
            brief,
            arbiter_model,
            criteria,
            max_parallel_patchers,
            lock_threshold,
            self_refine,
        } = p;
        let mut v = Violations::new();
        let sections: Vec<Section> = convert::document::sections(sections, &field("sections"), &mut v)
            .into_iter()
            .enumerate()
            .map(|(i, mut s)| {
                s.index = i as u32;
                s
            })
            .collect();
        if verdicts.len() > MAX_JUDGES {
            v.push(field("verdicts"), format!("has {} verdicts; the limit is {MAX_JUDGES}", verdicts.len()));
        }
        let verdicts: Vec<JudgeVerdict> = verdicts
            .into_iter()
            .enumerate()
            .map(|(i, x)| convert::document::verdict(x, &field(&format!("verdicts[{i}]")), &mut v))
            .collect();
        let judges: Vec<PanelJudge> = judges
            .into_iter()
            .enumerate()
            .map(|(i, j)| PanelJudge {
                id: j.id,
                model: convert::model_spec(j.model, &field(&format!("judges[{i}].model")), &mut v),
            })
            .collect();
        let judges = panel_or_default(judges);
        check_judges(&judges, &field("judges"), &mut v);
        let mode = match gw::RefinementMode::try_from(mode) {
            Ok(gw::RefinementMode::FullAuto | gw::RefinementMode::Unspecified) => Mode::FullAuto,
            Ok(gw::RefinementMode::SemiAuto) => Mode::SemiAuto,
            Err(_) => {
                v.push(field("mode"), format!("unknown enum value {mode}"));
                Mode::FullAuto
            }
        };
        let max_iterations = max_iterations.unwrap_or(iteration::MAX_ITERATIONS as u32);
        if !(1..=MAX_ITERATIONS).contains(&max_iterations) {
            v.push(field("max_iterations"), format!("is {max_iterations}; it must be between 1 and {MAX_ITERATIONS}"));
        }
        // The first assessment is counted apart; unset, the budget scales with the document.
        let document_chars: usize = sections.iter().map(|s| s.content.chars().count() + s.title.chars().count()).sum();
        let token_budget = token_budget.unwrap_or_else(|| iteration::default_token_budget(document_chars));
        if !(TOKEN_BUDGET.0..=TOKEN_BUDGET.1).contains(&token_budget) {
            v.push(
                field("token_budget"),
                format!("is {token_budget}; it must be between {} and {}", TOKEN_BUDGET.0, TOKEN_BUDGET.1),
            );
        }
        let time_budget = time_budget_seconds.unwrap_or((iteration::MAX_ELAPSED_MS / 1000) as u32);
        if !(TIME_BUDGET_SECONDS.0..=TIME_BUDGET_SECONDS.1).contains(&time_budget) {
            v.push(
                field("time_budget_seconds"),
                format!("is {time_budget}; it must be between {} and {}", TIME_BUDGET_SECONDS.0, TIME_BUDGET_SECONDS.1),
            );
        }
        let max_parallel_patchers = max_parallel_patchers.unwrap_or(assay_domain::arbiter::MAX_PARALLEL_PATCHERS);
        if !(1..=assay_domain::arbiter::MAX_PARALLEL_PATCHERS).contains(&max_parallel_patchers) {
            v.push(
                field("max_parallel_patchers"),
                format!(
                    "is {max_parallel_patchers}; it must be between 1 and {}",
                    assay_domain::arbiter::MAX_PARALLEL_PATCHERS
                ),
            );
        }
        let lock_threshold = lock_threshold.unwrap_or(DEFAULT_LOCK_THRESHOLD);
        if !(0.0..=1.0).contains(&lock_threshold) {
            v.push(field("lock_threshold"), format!("is {lock_threshold}; it must be between 0 and 1"));
        }
        let brief = convert::document::brief(brief, &field("brief"), &mut v);
        let criteria = convert::document::criteria(criteria, &field("criteria"), &mut v);
        check_criteria(&criteria, &field("criteria"), &mut v);
        let criteria = if criteria.is_empty() { default_criteria() } else { criteria };
        let models = Models {
            patcher: convert::model_spec(patcher_model, &field("patcher_model"), &mut v),
            expander: convert::model_spec(expander_model, &field("expander_model"), &mut v),
            delta: convert::model_spec(delta_judge_model, &field("delta_judge_model"), &mut v),
            arbiter: convert::model_spec(arbiter_model, &field("arbiter_model"), &mut v),
        };
        let hook = self_refine.map(|h| convert::self_refine::self_refine_hook(h, &field("self_refine"), &mut v));
        v.into_result()?;
        stages.refinement()?;
        if hook.is_some() {
            stages.self_refiner()?;
        }
        Ok(Self {
            sections,
            verdicts,
            judges,
            brief,
            criteria,
            mode,
            limits: Limits {
                max_iterations: max_iterations as usize,
                max_tokens: token_budget,
                max_elapsed_ms: u64::from(time_budget) * 1000,
            },
            max_parallel_patchers,
            lock_threshold,
            models,
            hook,
            stages,
            gate: Mutex::new(()),
            accepted: std::sync::atomic::AtomicBool::new(false),
            clock: Clock { start: Instant::now(), waited: StdMutex::new(Duration::ZERO) },
        })
    }
}
