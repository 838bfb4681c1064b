//! What the commands print. JSON comes from the proto3 JSON mapping ([`json`]); the human lines
//! come from one module per pipeline, so a verb and `assay runs watch` word an event alike.

pub mod checklist_eval;
pub mod debate;
pub mod events;
pub mod generate_checklist;
pub mod json;
pub mod junit;
pub mod report;
pub mod self_refine;
pub mod targeted_refinement;

use assay_proto::arbiter::v1 as arb;
use assay_proto::common::v1 as common;
use assay_proto::gateway::v1 as gw;
use assay_proto::refiners::v1 as ref_pb;

/// What calls cost, as the summaries say it: `$0.0123`, or `cost unknown (3 calls without a
/// price)` (an unpriced model costs "unknown", never zero).
pub fn cost_text(u: &assay_proto::common::v1::Usage) -> String {
    let measured = measured_cost_text(u);
    // Attempts given up on are counted at their reservation: said apart from what was measured.
    match u.abandoned_calls {
        0 => measured,
        n => format!(
            "{measured} ({n} abandoned call{} counted at their reservation: {} tokens, ${:.4})",
            if n == 1 { "" } else { "s" },
            u.abandoned_tokens,
            u.abandoned_cost_usd
        ),
    }
}

fn measured_cost_text(u: &assay_proto::common::v1::Usage) -> String {
    match u.cost_usd {
        Some(c) => format!("${c:.4}"),
        None if u.unpriced_calls > 0 => format!(
            "cost unknown ({} call{} without a price)",
            u.unpriced_calls,
            if u.unpriced_calls == 1 { "" } else { "s" }
        ),
        // A sender that knows no prices.
        None if u.calls > 0 => "cost unknown".to_string(),
        None => "$0.0000".to_string(),
    }
}

/// An enum name without its prefix, lower case (`RUN_STATE_AWAITING_HUMAN` -> `awaiting_human`).
pub fn lower(name: &str, prefix: &str) -> String {
    name.trim_start_matches(prefix).to_lowercase()
}

/// Lower-case names of the wire enums, as the human lines say them; an unknown number prints as
/// the number.
macro_rules! enum_names {
    ($($(#[$doc:meta])* $name:ident: $ty:ty, $prefix:literal;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(v: i32) -> String {
                <$ty>::try_from(v).map_or_else(|_| v.to_string(), |e| lower(e.as_str_name(), $prefix))
            }
        )*
    };
}

enum_names! {
    /// A run state (`awaiting_human`).
    state_name: gw::RunState, "RUN_STATE_";
    /// A pipeline kind (`targeted_refinement`).
    kind_name: gw::PipelineKind, "PIPELINE_KIND_";
    /// A refinement mode (`semi_auto`).
    mode_name: gw::RefinementMode, "REFINEMENT_MODE_";
    /// A quality status (`below_standard`).
    quality_name: gw::QualityStatus, "QUALITY_STATUS_";
    /// A refinement outcome (`accepted_with_warning`).
    outcome_name: gw::RefinementOutcome, "REFINEMENT_OUTCOME_";
    /// A fix action (`surgical_edit`).
    action_name: arb::FixAction, "FIX_ACTION_";
    /// An agreement level (`moderate`).
    agreement_name: arb::AgreementLevel, "AGREEMENT_LEVEL_";
    /// An issue severity (`critical`).
    severity_name: common::Severity, "SEVERITY_";
    /// Why self-refine stopped (`max_passes`).
    stop_reason_name: ref_pb::SelfRefineStopReason, "SELF_REFINE_STOP_REASON_";
}

/// `1 task`, `2 tasks`, `2 passes`, `2 batches`.
pub fn plural(n: usize, one: &str) -> String {
    let many = if one.ends_with('s') || one.ends_with("ch") { "es" } else { "s" };
    if n == 1 { format!("{n} {one}") } else { format!("{n} {one}{many}") }
}

/// A stage's progress report, as the verbs note it (`generate: 2/4 items`).
pub fn stage_progress_line(p: &common::Progress) -> String {
    format!("{}: {}/{} {}", p.stage, p.done, p.total, p.message)
}

/// A state change, as `assay refine`, `assay refine-text` and `assay runs watch` print it.
pub fn state_line(s: &gw::RunStateChanged) -> String {
    if s.reason.is_empty() {
        format!("state: {}", state_name(s.state))
    } else {
        format!("state: {} ({})", state_name(s.state), s.reason)
    }
}

#[cfg(test)]
mod cost_tests {
    use super::cost_text;
    use assay_proto::common::v1::Usage;

    #[test]
    fn abandoned_calls_are_said_apart_from_the_measured_cost() {
        let measured = Usage { calls: 3, cost_usd: Some(0.5), ..Default::default() };
        assert_eq!(cost_text(&measured), "$0.5000");
        let with = Usage { abandoned_calls: 2, abandoned_tokens: 4200, abandoned_cost_usd: 0.25, ..measured };
        assert_eq!(cost_text(&with), "$0.5000 (2 abandoned calls counted at their reservation: 4200 tokens, $0.2500)");
    }
}
