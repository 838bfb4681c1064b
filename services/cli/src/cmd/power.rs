//! `assay power --baseline FILE [--candidate FILE] --mde X | --n N`: how many records a comparison
//! needs to detect a given difference, or the smallest difference n records detect (both: the power
//! achieved), from the variance of a pilot, as evalconfidence 0.1.1's `power` computes it
//! ([`assay_domain::stats::power`]). One pilot file plans an unpaired comparison from its per-record
//! variance; two files of the same records plan a paired one from their per-record differences.

use assay_domain::stats::power::{Design, Pilot, Plan, Question, power};
use serde_json::{Value, json};

use super::error::{CliError, Ending, Outcome};
use super::source::{self, Metric, label};

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
pub fn run(args: PowerArgs) -> Outcome {
    let p = plan(&args).map_err(CliError::BadInput)?;
    if args.json {
        outln!("{}", to_json(&p, &args));
    } else {
        out!("{}", text(&p, &args));
    }
    Ok(Ending::Done)
}

/// The most records a plan may ask for or be asked about (per run): beyond it an answer is no
/// plan (and a records count would overflow).
const MAX_RECORDS: u64 = 1_000_000_000;
/// `--alpha`'s range: a two-sided significance level.
const ALPHA_RANGE: (f64, f64) = (1e-9, 0.5);
/// `--power`'s range: below 0.5 the normal approximation asks for more records the lower the
/// power; above it, a target no pilot supports.
const POWER_RANGE: (f64, f64) = (0.5, 0.9999);

fn plan(args: &PowerArgs) -> Result<Plan, String> {
    let q = Question { mde: args.mde, n: args.n, alpha: args.alpha, power: args.power };
    // Options first, so a bad option is named before any file is read.
    let (lo, hi) = ALPHA_RANGE;
    if !(q.alpha >= lo && q.alpha <= hi) {
        return Err(format!("--alpha must be in [{lo:e}, {hi}] (the two-sided significance level), got {:?}", q.alpha));
    }
    let (lo, hi) = POWER_RANGE;
    if !(q.power >= lo && q.power <= hi) {
        return Err(format!(
            "--power must be in [{lo}, {hi}] (the chance of detecting a true difference of --mde), got {:?}",
            q.power
        ));
    }
    if let Some(m) = q.mde
        && !(m.is_finite() && m > 0.0)
    {
        return Err(format!("--mde must be a finite number > 0 (a difference in score units), got {m:?}"));
    }
    if let Some(n) = q.n
        && !(2..=MAX_RECORDS).contains(&n)
    {
        return Err(format!("--n must be in [2, {MAX_RECORDS}] (records per run), got {n}"));
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
    let files = match &args.candidate {
        Some(c) => format!("{} and {}", label(&args.baseline), label(c)),
        None => label(&args.baseline),
    };
    let cannot = |why: String| format!("cannot plan from {files} ({} scored): {why}", args.metric.field());
    let p = power(pilot, q).map_err(|e| cannot(e.to_string()))?;
    if !(p.variance.is_finite() && p.variance > 0.0) {
        let records = p.pilot_records.unwrap_or_default();
        return Err(cannot(if records < 2 {
            format!(
                "the pilot has {records} scored record(s) and a variance needs at least 2 (the lines of one \
                 record id, its epochs, are one record)"
            )
        } else {
            format!("the pilot's variance is {:?}, not a positive number", p.variance)
        }));
    }
    if let (Some(mde), Some(needed)) = (q.mde, p.n_required) {
        // What `n` records detect, to name the range of --mde this pilot allows.
        let detectable =
            |n: u64| power(pilot, Question { mde: None, n: Some(n), ..q }).ok().and_then(|p| p.mde_detectable);
        let per = if p.design == Design::Unpaired { " per run" } else { "" };
        if needed > MAX_RECORDS {
            return Err(format!(
                "--mde {mde:?} is too small for this pilot: it needs more than {MAX_RECORDS} records{per} (the \
                 most a plan may ask for); --mde must be at least {} here",
                detectable(MAX_RECORDS).map_or_else(|| "that".to_string(), |m| rounded(m, true))
            ));
        }
        if needed < 2 {
            return Err(format!(
                "--mde {mde:?} is too large for this pilot: the plan asks for fewer than 2 records{per} (a \
                 comparison needs 2); --mde must be below {} here",
                // One record detects sqrt(2) times what two do.
                detectable(2).map_or_else(|| "that".to_string(), |m| rounded(m * std::f64::consts::SQRT_2, false))
            ));
        }
    }
    Ok(p)
}

/// `x` (> 0) to 4 significant digits, rounded up or down so that the bound it names still holds.
fn rounded(x: f64, up: bool) -> String {
    let scale = 10f64.powf(3.0 - x.log10().floor());
    let r = if up { (x * scale).ceil() } else { (x * scale).floor() } / scale;
    if (1e-3..1e6).contains(&r) { format!("{r}") } else { format!("{r:.3e}") }
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

#[cfg(test)]
mod tests {
    use super::rounded;

    #[test]
    fn bounds_are_rounded_on_their_safe_side() {
        assert_eq!(rounded(1.77741e-5, true), "1.778e-5");
        assert_eq!(rounded(1.77779e-5, false), "1.777e-5");
        assert_eq!(rounded(0.31, true), "0.31");
        assert_eq!(rounded(0.123456, false), "0.1234");
        assert_eq!(rounded(1234567.0, false), "1.234e6");
    }
}
