//! `assay compare BASELINE CANDIDATE`: the paired comparison of two evaluation runs, each a
//! results file (the JSON lines of `assay eval --out` / `assay score --out`) or a run id in the
//! gateway's store, records paired by `id`, with the core of
//! [`assay_domain::stats::runs`] (the one `GatewayService.CompareRuns` uses): the statistics, the
//! per-item flips, the worst regressions, the records found on one side only, and an optional
//! regression gate for CI. Two run ids are compared by the gateway (CompareRuns); a file and a run
//! id locally, the run fetched with GetRun. The numbers are the same either way.

use std::path::{Path, PathBuf};

use assay_config::AssayConfig;
use assay_domain::stats::runs::{self, CompareOptions, Gate, ItemFlips, RecordDiff, RunComparison, RunMetric};
use assay_domain::stats::{BootstrapInterval, Comparison, DEFAULT_BOOTSTRAP_SEED, Method};
use assay_proto::gateway::v1 as gw;

use super::common::{BackendArgs, load_config};
use super::error::{CliError, Ending, Outcome, status_text};
use super::render::junit::{self, Compared, Suite};
use super::session::client;
use super::source::{self, Metric, Spec};

/// Records listed as the worst regressions in the table.
const WORST: usize = runs::WORST_RECORDS;

impl Metric {
    fn to_proto(self) -> gw::CompareMetric {
        match self {
            Self::Primary => gw::CompareMetric::Primary,
            Self::PassRate => gw::CompareMetric::PassRate,
            Self::Weighted => gw::CompareMetric::Weighted,
            Self::Normalized => gw::CompareMetric::Normalized,
        }
    }
}

/// Options of `assay compare`.
#[derive(clap::Args, Clone, Debug)]
pub struct CompareArgs {
    /// Baseline results: a JSON-lines file written by `assay eval --out` or `assay score --out`,
    /// or the id of a checklist_eval run in the gateway's store.
    pub baseline: String,
    /// Candidate results, a file or a run id; the difference is candidate minus baseline.
    pub candidate: String,
    /// The per-record score to compare.
    #[arg(long, value_enum, default_value = "primary")]
    pub metric: Metric,
    /// Significance level; intervals are at 1 - alpha.
    #[arg(long, default_value_t = 0.05)]
    pub alpha: f64,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Exit 1 when the candidate is significantly worse: the interval on the difference lies
    /// entirely below -min-effect. Exit 2 when a statistic is not a number (no verdict).
    #[arg(long)]
    pub fail_on_regression: bool,
    /// With --fail-on-regression: the smallest drop that counts (default 0, in score units).
    #[arg(long, requires = "fail_on_regression")]
    pub min_effect: Option<f64>,
    /// Seed of the paired bootstrap interval (10,000 resamples).
    #[arg(long, default_value_t = DEFAULT_BOOTSTRAP_SEED)]
    pub seed: u64,
    /// Gateway address for run ids (default: the configured gateway port on this machine).
    #[arg(long)]
    pub gateway: Option<String>,
    /// Compare two responders of runs evaluated with `assay eval --respond`: give it twice, the
    /// baseline's responder then the candidate's (the same run id may be both sides).
    #[arg(long, value_name = "NAME")]
    pub responder: Vec<String>,
    /// Also write the comparison as a JUnit XML report to FILE, for CI systems: one test case,
    /// failed when the candidate regressed by the rule of --fail-on-regression (at --min-effect,
    /// else 0, with or without that flag), its message the difference, the interval and p; in
    /// error when a statistic is not a number or the comparison could not be made. Written whole
    /// (a temporary file renamed over FILE). The exit code is the same with or without it.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
}

/// `assay compare` with the configuration at `config` (`--config`; its token and TLS settings reach
/// the gateway): 0 done, 1 a significant regression under --fail-on-regression, 2 bad input (every
/// error of this verb).
pub async fn run(config: Option<&Path>, args: CompareArgs) -> Outcome {
    let started = (std::time::Instant::now(), std::time::SystemTime::now());
    let compared = async {
        let config = load_config(config, &BackendArgs::default())?;
        report(&config, &args).await.map_err(CliError::BadInput)
    };
    let (r, labels) = match compared.await {
        Ok(r) => r,
        Err(e) => {
            // No comparison: the report says why (never an older report's verdict).
            if let Some(path) = &args.junit
                && let Err(w) = junit::write_error(path, "compare", args.metric.field(), e.message())
            {
                eprintln!("assay compare: {w}");
            }
            return Err(e.bad_input());
        }
    };
    if let Some(path) = &args.junit {
        write_junit(path, &r, &labels, &args, started).map_err(CliError::BadInput)?;
    }
    compare(r, &labels, &args).map_err(CliError::bad_input)
}

/// The `--junit` report of a comparison: one test case, failed when it regressed (the gate's rule,
/// computed at --min-effect or 0 when --fail-on-regression did not ask for it), with the table as
/// the suite's output.
fn write_junit(
    path: &Path,
    r: &RunComparison,
    labels: &[String; 2],
    args: &CompareArgs,
    (clock, started): (std::time::Instant, std::time::SystemTime),
) -> Result<(), String> {
    let c = &r.comparison;
    let gate = r.gate.clone().unwrap_or_else(|| runs::gate(c, args.min_effect.unwrap_or(0.0)));
    let numbers = Compared {
        diff: c.diff,
        ci: c.ci,
        alpha: c.alpha,
        p_value: c.p_value,
        method: c.method.as_str(),
        pairs: c.n_pairs.map(|n| n as u64),
        regressed: gate.regressed,
        reason: &gate.reason,
    };
    let field = r.metric.field();
    let case = junit::comparison_case(
        junit::classname("compare", field, None),
        format!("{} vs {}", labels[1], labels[0]),
        &numbers,
    );
    let mut properties = vec![
        ("baseline".to_string(), labels[0].clone()),
        ("candidate".to_string(), labels[1].clone()),
        ("metric".to_string(), field.to_string()),
        ("alpha".to_string(), c.alpha.to_string()),
        ("min_effect".to_string(), gate.min_effect.to_string()),
        ("method".to_string(), c.method.as_str().to_string()),
        ("diff".to_string(), c.diff.to_string()),
        ("ci_low".to_string(), c.ci.0.to_string()),
        ("ci_high".to_string(), c.ci.1.to_string()),
        ("p_value".to_string(), c.p_value.to_string()),
    ];
    if let Some(n) = c.n_pairs {
        properties.push(("pairs".into(), n.to_string()));
    }
    let suite = Suite {
        name: format!("assay compare {field}"),
        package: "assay.compare".into(),
        started,
        seconds: clock.elapsed().as_secs_f64(),
        properties,
        out: format!("{}{}", table(r, labels), gate.reason),
    };
    junit::write(path, &[(suite, vec![case])]).map(|_| ())
}

fn compare(mut r: RunComparison, labels: &[String; 2], args: &CompareArgs) -> Outcome {
    if let Some(why) = undefined(&r.comparison) {
        // A statistic that is not a number decides nothing: the gate never passes on it.
        if args.fail_on_regression {
            return Err(CliError::BadInput(format!("no verdict, the regression gate cannot pass: {why}")));
        }
        r.comparison.warnings.push(why);
    }
    if args.json {
        outln!("{}", runs::to_json(&r));
    } else {
        out!("{}", table(&r, labels));
    }
    match &r.gate {
        Some(g) => {
            eprintln!("{}", g.reason);
            Ok(if g.regressed { Ending::Regressed } else { Ending::Done })
        }
        None => Ok(Ending::Done),
    }
}

/// The report and the two sides' labels (path, or `run <id>`).
async fn report(config: &AssayConfig, args: &CompareArgs) -> Result<(RunComparison, [String; 2]), String> {
    if !(args.alpha > 0.0 && args.alpha < 1.0) {
        return Err(format!("--alpha must be in (0, 1), got {}", args.alpha));
    }
    if let Some(m) = args.min_effect
        && !(m.is_finite() && m >= 0.0)
    {
        return Err(format!("--min-effect must be a finite number >= 0, got {m}"));
    }
    let metric = args.metric.run_metric();
    let (base, cand) = (Spec::parse(&args.baseline)?, Spec::parse(&args.candidate)?);
    let labels = [base.label(), cand.label()];
    let min_effect = args.fail_on_regression.then(|| args.min_effect.unwrap_or(0.0));
    let url = source::gateway_url(config, args.gateway.as_deref());
    let responders: Option<[&str; 2]> = match args.responder.as_slice() {
        [] => None,
        [b, c] => Some([b.as_str(), c.as_str()]),
        other => {
            return Err(format!(
                "--responder takes two names (the baseline's, then the candidate's), got {}",
                other.len()
            ));
        }
    };
    if let Some(names) = responders {
        let mut sides = Vec::new();
        for (spec, name) in [(&base, names[0]), (&cand, names[1])] {
            let Spec::Run(id) = spec else {
                return Err(format!("--responder compares runs by id; {} is a file", spec.label()));
            };
            let mut e = source::fetch_evaluation(config, &url, id).await?;
            let known: Vec<String> = e.responders.iter().map(|r| r.name.clone()).collect();
            if !known.iter().any(|k| k == name) {
                return Err(format!(
                    "run {id} has no responder {name:?}; its responders: {}",
                    if known.is_empty() { "none".to_string() } else { known.join(", ") }
                ));
            }
            e.results.retain(|r| r.responder == name);
            sides.push(assay_proto::convert::runs::run_results(&e, metric));
        }
        let labels = [format!("{} ({})", labels[0], names[0]), format!("{} ({})", labels[1], names[1])];
        let cand_results = sides.pop().unwrap_or_default();
        let base_results = sides.pop().unwrap_or_default();
        let options = CompareOptions { metric, alpha: args.alpha, seed: args.seed, min_effect };
        // As the run compares its responders: on the records both have a score for.
        let r = runs::compare_complete(&base_results, &cand_results, options).map_err(|e| compare_error(e, &labels))?;
        return Ok((r, labels));
    }
    if let (Spec::Run(b), Spec::Run(c)) = (&base, &cand) {
        let request = gw::CompareRunsRequest {
            baseline_run_id: b.clone(),
            candidate_run_id: c.clone(),
            metric: args.metric.to_proto() as i32,
            alpha: args.alpha,
            min_effect,
            bootstrap_seed: Some(args.seed),
        };
        let reply = client(config, &url).map_err(CliError::into_message)?.compare_runs(request).await.map_err(|s| {
            let code = s.code();
            if code == tonic::Code::Unavailable || code == tonic::Code::Unknown {
                format!("the gateway at {url} is unreachable to compare runs {b} and {c}: {}", status_text(&s))
            } else if code == tonic::Code::NotFound {
                format!("unknown run id: {} (not a file either) on the gateway at {url}", s.message())
            } else {
                status_text(&s)
            }
        })?;
        return Ok((from_response(reply.into_inner())?, labels));
    }
    let load = |spec: Spec| {
        let url = url.clone();
        async move {
            match spec {
                Spec::File(p) => source::read_file(&p, metric),
                Spec::Run(id) => source::fetch_run(config, &url, &id, metric).await,
            }
        }
    };
    let (b, c) = (load(base).await?, load(cand).await?);
    let options = CompareOptions { metric, alpha: args.alpha, seed: args.seed, min_effect };
    let r = runs::compare_runs(&b, &c, options).map_err(|e| compare_error(e, &labels))?;
    Ok((r, labels))
}

/// A comparison that could not be made, in words.
fn compare_error(e: runs::RunCompareError, labels: &[String; 2]) -> String {
    match e {
        runs::RunCompareError::NoSharedRecords { baseline, candidate } => format!(
            "no shared records: {} ({baseline} scored) and {} ({candidate} scored) have no scored record id in common",
            labels[0], labels[1]
        ),
        runs::RunCompareError::Stats(s) => format!("cannot compare: {s}"),
    }
}

/// Why the comparison's numbers decide nothing, when a statistic is not a (finite) number: which
/// ones, and the side with too few records when that is the cause.
fn undefined(c: &Comparison) -> Option<String> {
    let mut bad = Vec::new();
    if !c.diff.is_finite() {
        bad.push("the difference");
    }
    if !(c.ci.0.is_finite() && c.ci.1.is_finite()) {
        bad.push("the interval");
    }
    if !c.p_value.is_finite() {
        bad.push("the p-value");
    }
    let (last, rest) = bad.split_last()?;
    let what = if rest.is_empty() { (*last).to_string() } else { format!("{} and {last}", rest.join(", ")) };
    let mut why = format!(
        "diff {:+.4}, {:.0}% CI [{:+.4}, {:+.4}], p = {:.4} ({}): {what} {}",
        c.diff,
        100.0 * (1.0 - c.alpha),
        c.ci.0,
        c.ci.1,
        c.p_value,
        c.method.as_str(),
        if rest.is_empty() { "is not a number" } else { "are not numbers" }
    );
    if c.n_records_a < 2 || c.n_records_b < 2 {
        why.push_str(&format!(
            "; the candidate has {} scored record(s) and the baseline {}, and each side needs at least 2",
            c.n_records_a, c.n_records_b
        ));
    }
    Some(why)
}

/// CompareRuns' answer as the core's report (what the table and `--json` print).
fn from_response(r: gw::CompareRunsResponse) -> Result<RunComparison, String> {
    let gw::CompareRunsResponse {
        baseline_run_id: _,
        candidate_run_id: _,
        metric,
        method,
        paired,
        alpha,
        n_pairs,
        n_baseline,
        n_candidate,
        mean_baseline,
        mean_candidate,
        diff,
        ci_low,
        ci_high,
        p_value,
        significant: _,
        variance_reduction,
        effective_n,
        n_discordant,
        odds_ratio,
        odds_ratio_ci_low,
        odds_ratio_ci_high,
        bootstrap,
        warnings,
        notes,
        items,
        worst_regressions,
        baseline_only,
        candidate_only,
        unscored_baseline,
        unscored_candidate,
        gate,
    } = r;
    let method = match gw::CompareMethod::try_from(method) {
        Ok(gw::CompareMethod::PairedT) => Method::PairedT,
        Ok(gw::CompareMethod::Mcnemar) => Method::McNemar,
        Ok(gw::CompareMethod::WelchT) => Method::WelchT,
        Ok(gw::CompareMethod::TwoProportion) => Method::TwoProportion,
        Ok(gw::CompareMethod::Unspecified) | Err(_) => return Err(format!("the gateway answered method {method}")),
    };
    let metric = match gw::CompareMetric::try_from(metric) {
        Ok(gw::CompareMetric::Primary | gw::CompareMetric::Unspecified) => RunMetric::Primary,
        Ok(gw::CompareMetric::PassRate) => RunMetric::PassRate,
        Ok(gw::CompareMetric::Weighted) => RunMetric::Weighted,
        Ok(gw::CompareMetric::Normalized) => RunMetric::Normalized,
        Err(_) => return Err(format!("the gateway answered metric {metric}")),
    };
    let comparison = Comparison {
        method,
        paired,
        n_records_a: n_candidate as usize,
        n_records_b: n_baseline as usize,
        n_pairs: n_pairs.map(|n| n as usize),
        mean_a: mean_candidate,
        mean_b: mean_baseline,
        diff,
        ci: (ci_low, ci_high),
        p_value,
        alpha,
        variance_reduction,
        effective_n,
        odds_ratio,
        ci_odds_ratio: odds_ratio_ci_low.zip(odds_ratio_ci_high),
        n_discordant,
        pairs: Vec::new(),
        warnings,
        notes,
    };
    Ok(RunComparison {
        metric,
        comparison,
        bootstrap: bootstrap.map(|b| BootstrapInterval {
            low: b.ci_low,
            high: b.ci_high,
            resamples: b.resamples as usize,
            seed: b.seed,
        }),
        items: items
            .into_iter()
            .map(|i| ItemFlips {
                item: i.item,
                compared: i.compared as usize,
                yes_to_no: i.yes_to_no as usize,
                no_to_yes: i.no_to_yes as usize,
            })
            .collect(),
        worst: worst_regressions
            .into_iter()
            .map(|w| RecordDiff { id: w.record_id, baseline: w.baseline, candidate: w.candidate })
            .collect(),
        baseline_only,
        candidate_only,
        unscored_baseline,
        unscored_candidate,
        gate: gate.map(|g| Gate { regressed: g.regressed, min_effect: g.min_effect, reason: g.reason }),
    })
}

fn list(ids: &[String]) -> String {
    const SHOWN: usize = 20;
    let mut s = ids.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(", ");
    if ids.len() > SHOWN {
        s.push_str(&format!(", ... ({} more)", ids.len() - SHOWN));
    }
    s
}

fn table(r: &RunComparison, labels: &[String; 2]) -> String {
    use std::fmt::Write;
    let c = &r.comparison;
    let conf = format!("{:.0}%", 100.0 * (1.0 - c.alpha));
    let mut s = String::new();
    let _ = writeln!(s, "{} (candidate - baseline), {}", r.metric.field(), c.method.as_str());
    let _ = writeln!(s, "  {:<11} {:>10}  {:>8}  results", "", "records", "mean");
    let _ = writeln!(s, "  {:<11} {:>10}  {:>8.4}  {}", "baseline", c.n_records_b, c.mean_b, labels[0]);
    let _ = writeln!(s, "  {:<11} {:>10}  {:>8.4}  {}", "candidate", c.n_records_a, c.mean_a, labels[1]);
    let pairs = c.n_pairs.map_or_else(|| "unpaired".to_string(), |n| format!("{n} pairs"));
    let _ = writeln!(
        s,
        "  {:<11} {:>10}  {:>+8.4}  {conf} CI [{:+.4}, {:+.4}], p = {:.4}, {}",
        "diff",
        pairs,
        c.diff,
        c.ci.0,
        c.ci.1,
        c.p_value,
        if c.significant() { "significant" } else { "not significant" }
    );
    if let Some(b) = r.bootstrap {
        let _ = writeln!(
            s,
            "  {:<11} {:>10}  {:>8}  {conf} CI [{:+.4}, {:+.4}] ({} resamples, seed {})",
            "bootstrap", "", "", b.low, b.high, b.resamples, b.seed
        );
    }
    if let (Some(vr), Some(n)) = (c.variance_reduction, c.effective_n) {
        let _ = writeln!(s, "  pairing: variance {vr:.2}x smaller, worth ~{n:.0} unpaired records");
    }
    if let (Some(d), Some(or), Some((lo, hi))) = (c.n_discordant, c.odds_ratio, c.ci_odds_ratio) {
        let _ = writeln!(s, "  mcnemar: {d} discordant records, odds ratio {or:.2} [{lo:.2}, {hi:.2}]");
    }
    let flipped: Vec<&ItemFlips> = r.items.iter().filter(|i| i.yes_to_no + i.no_to_yes > 0).collect();
    if !flipped.is_empty() {
        let _ = writeln!(s, "items that flipped (yes->no, no->yes, of records compared):");
        for i in flipped.iter().take(WORST) {
            let _ = writeln!(s, "  {:>4} {:>4} {:>5}  {}", i.yes_to_no, i.no_to_yes, i.compared, i.item);
        }
        if flipped.len() > WORST {
            let _ = writeln!(s, "  ... {} more items flipped (--json lists all)", flipped.len() - WORST);
        }
    }
    if !r.worst.is_empty() {
        let _ = writeln!(s, "largest regressions:");
        for w in &r.worst {
            let _ = writeln!(s, "  {}: {:.4} -> {:.4} ({:+.4})", w.id, w.baseline, w.candidate, w.diff());
        }
    }
    if !r.baseline_only.is_empty() {
        let _ = writeln!(s, "only in baseline ({}): {}", r.baseline_only.len(), list(&r.baseline_only));
    }
    if !r.candidate_only.is_empty() {
        let _ = writeln!(s, "only in candidate ({}): {}", r.candidate_only.len(), list(&r.candidate_only));
    }
    if !r.unscored_baseline.is_empty() {
        let _ = writeln!(s, "unscored in baseline ({}): {}", r.unscored_baseline.len(), list(&r.unscored_baseline));
    }
    if !r.unscored_candidate.is_empty() {
        let _ = writeln!(s, "unscored in candidate ({}): {}", r.unscored_candidate.len(), list(&r.unscored_candidate));
    }
    for w in &c.warnings {
        let _ = writeln!(s, "warning: {w}");
    }
    for n in &c.notes {
        let _ = writeln!(s, "note: {n}");
    }
    s
}
