//! `assay power --baseline FILE [--candidate FILE] --mde X | --n N`: how many records a comparison
//! needs to detect a given difference, or the smallest difference n records detect (both: the power
//! achieved), from the variance of a pilot, as evalconfidence 0.1.1's `power` computes it
//! ([`assay_domain::stats::power`]). One pilot file plans an unpaired comparison from its per-record
//! variance; two files of the same records plan a paired one from their per-record differences.

use std::process::ExitCode;

use assay_domain::stats::power::{Design, Pilot, Plan, Question, power};
use serde_json::{Value, json};

use super::agreement::EXIT_BAD_INPUT;
use super::compare::Metric;
use super::source::{self, label};

/// Options of `assay power`.
#[derive(clap::Args, Clone, Debug)]
pub struct PowerArgs {
    /// Pilot results: a JSON-lines file written by `assay eval --out`, or the id of a
    /// checklist_eval run in the gateway's store.
    #[arg(long)]
    pub baseline: String,
    /// A second pilot run of the same records (the change under test): plans a paired comparison
    /// from the per-record differences, candidate minus baseline.
    #[arg(long)]
    pub candidate: Option<String>,
    /// Gateway address for run ids (default: the configured gateway port on this machine).
    #[arg(long)]
    pub gateway: Option<String>,
    /// Minimum detectable effect: the smallest difference worth detecting, in score units
    /// (0.05 = 5 points on a 0-1 score). Alone: the records needed.
    #[arg(long, required_unless_present = "n")]
    pub mde: Option<f64>,
    /// Records (per run): alone, the smallest detectable difference; with --mde, the power achieved.
    #[arg(long)]
    pub n: Option<u64>,
    /// Significance level of the planned two-sided test.
    #[arg(long, default_value_t = 0.05)]
    pub alpha: f64,
    /// Target power: the probability of detecting a true difference of --mde.
    #[arg(long, default_value_t = 0.8)]
    pub power: f64,
    /// The per-record score.
    #[arg(long, value_enum, default_value = "primary")]
    pub metric: Metric,
    /// Print one JSON object instead of the text.
    #[arg(long)]
    pub json: bool,
}

/// Run `assay power`: 0 done, 2 bad input.
pub fn run(args: PowerArgs) -> ExitCode {
    match plan(&args) {
        Err(e) => {
            eprintln!("assay power: {e}");
            ExitCode::from(EXIT_BAD_INPUT)
        }
        Ok(p) => {
            if args.json {
                outln!("{}", to_json(&p, &args));
            } else {
                out!("{}", text(&p, &args));
            }
            ExitCode::SUCCESS
        }
    }
}

fn plan(args: &PowerArgs) -> Result<Plan, String> {
    let q = Question { mde: args.mde, n: args.n, alpha: args.alpha, power: args.power };
    // Options first, so a bad option is named before any file is read.
    if !(q.alpha > 0.0 && q.alpha < 1.0) {
        return Err(format!("--alpha must be in (0, 1), got {}", q.alpha));
    }
    if !(q.power > 0.0 && q.power < 1.0) {
        return Err(format!("--power must be in (0, 1), got {}", q.power));
    }
    if let Some(m) = q.mde
        && !(m.is_finite() && m > 0.0)
    {
        return Err(format!("--mde must be a positive number (a difference in score units), got {m}"));
    }
    if let Some(n) = q.n
        && n < 2
    {
        return Err(format!("--n must be at least 2, got {n}"));
    }
    let metric = args.metric.run_metric();
    let base = source::load(&args.baseline, args.gateway.as_deref(), metric)?;
    let base_obs = base.observations();
    let cand = args.candidate.as_deref().map(|c| source::load(c, args.gateway.as_deref(), metric)).transpose()?;
    let cand_obs = cand.as_ref().map(|c| c.observations());
    let pilot = match &cand_obs {
        Some(c) => Pilot::Paired { a: c, b: &base_obs },
        None => Pilot::Single(&base_obs),
    };
    power(pilot, q).map_err(|e| {
        let files = match &args.candidate {
            Some(c) => format!("{} and {}", label(&args.baseline), label(c)),
            None => label(&args.baseline),
        };
        format!("cannot plan from {files} ({} scored): {e}", args.metric.field())
    })
}

fn effect(p: &Plan, x: f64) -> String {
    if p.scores_are_unit_scale { format!("{x:.4} ({:.1} points)", 100.0 * x) } else { format!("{x:.4}") }
}

fn text(p: &Plan, args: &PowerArgs) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let design = p.design.as_str();
    let per = if p.design == Design::Unpaired { " per run" } else { "" };
    let level = format!("alpha {} and {:.0}% power", p.alpha, 100.0 * p.target_power);
    match (p.n_required, p.mde_detectable, p.power_achieved) {
        (Some(n), _, _) => {
            let mde = p.mde.unwrap_or_default();
            let _ = writeln!(
                s,
                "records needed: {n} {design} records{per} to detect a difference of {} at {level}",
                effect(p, mde)
            );
        }
        (None, Some(mde), _) => {
            let n = p.n.unwrap_or_default();
            let _ = writeln!(
                s,
                "minimum detectable difference: {} with {n} {design} records{per} at {level}",
                effect(p, mde)
            );
        }
        (None, None, Some(achieved)) => {
            let (mde, n) = (p.mde.unwrap_or_default(), p.n.unwrap_or_default());
            let _ = writeln!(
                s,
                "power: {:.1}% to detect a difference of {} with {n} {design} records{per} at alpha {} (target {:.0}%)",
                100.0 * achieved,
                effect(p, mde),
                p.alpha,
                100.0 * p.target_power
            );
        }
        (None, None, None) => {}
    }
    let pilot = match &args.candidate {
        Some(c) => format!("{} vs {}", label(c), label(&args.baseline)),
        None => label(&args.baseline),
    };
    let _ = writeln!(
        s,
        "per-record variance of the compared {}: {:.6} (pilot: {pilot}, {} records)",
        args.metric.field(),
        p.variance,
        p.pilot_records.unwrap_or_default()
    );
    for n in &p.notes {
        let _ = writeln!(s, "note: {n}");
    }
    s
}

fn to_json(p: &Plan, args: &PowerArgs) -> Value {
    json!({
        "design": p.design.as_str(),
        "metric": args.metric.field(),
        "baseline": label(&args.baseline),
        "candidate": args.candidate.as_deref().map(label),
        "pilot_records": p.pilot_records,
        "variance": p.variance,
        "alpha": p.alpha,
        "power": p.target_power,
        "mde": p.mde,
        "n": p.n,
        "n_required": p.n_required,
        "mde_detectable": p.mde_detectable,
        "power_achieved": p.power_achieved,
        "scores_are_unit_scale": p.scores_are_unit_scale,
        "notes": p.notes,
    })
}
