//! `assay compare BASELINE CANDIDATE`: the paired comparison of two evaluation result files (the
//! JSON lines of `assay eval --out` / `assay score --out`), records paired by `id`, with the
//! statistics of [`assay_domain::stats`], the per-item flips, the worst regressions, the records
//! found in only one file, and an optional regression gate for CI.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use assay_domain::stats::{self, BOOTSTRAP_RESAMPLES, BootstrapInterval, Comparison, DEFAULT_BOOTSTRAP_SEED};
use serde_json::{Value, json};

/// Exit code of `--fail-on-regression` when the candidate is significantly worse.
pub const EXIT_REGRESSION: u8 = 1;
/// Exit code for bad input (missing file, malformed line, no shared records, bad option).
pub const EXIT_BAD_INPUT: u8 = 2;
/// Records listed as the worst regressions.
const WORST: usize = 10;

/// The per-record score compared.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    /// `primary_score`: the scorer's primary metric.
    Primary,
    /// `pass_rate`: the share of items answered yes.
    #[value(name = "pass_rate")]
    PassRate,
    /// `weighted_score`.
    Weighted,
    /// `normalized_score`.
    Normalized,
}

impl Metric {
    /// The field of an `assay eval --out` line.
    pub fn field(self) -> &'static str {
        match self {
            Self::Primary => "primary_score",
            Self::PassRate => "pass_rate",
            Self::Weighted => "weighted_score",
            Self::Normalized => "normalized_score",
        }
    }
}

/// Options of `assay compare`.
#[derive(clap::Args, Clone, Debug)]
pub struct CompareArgs {
    /// Baseline results: a JSON-lines file written by `assay eval --out` or `assay score --out`
    /// (files only for now: run ids from the store are not accepted yet).
    pub baseline: PathBuf,
    /// Candidate results, the same format; the difference is candidate minus baseline.
    pub candidate: PathBuf,
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
    /// entirely below -min-effect.
    #[arg(long)]
    pub fail_on_regression: bool,
    /// With --fail-on-regression: the smallest drop that counts (default 0, in score units).
    #[arg(long, requires = "fail_on_regression")]
    pub min_effect: Option<f64>,
    /// Seed of the paired bootstrap interval (10,000 resamples).
    #[arg(long, default_value_t = DEFAULT_BOOTSTRAP_SEED)]
    pub seed: u64,
}

/// One line of a results file.
struct Line {
    id: String,
    /// None: the record failed or carries no score.
    score: Option<f64>,
    /// Item (question text when the line has it, else item id) -> yes (true) / no (false).
    answers: BTreeMap<String, bool>,
}

/// A results file, its lines in order.
struct Results {
    path: PathBuf,
    lines: Vec<Line>,
}

impl Results {
    fn read(path: &Path, metric: Metric) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut lines = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            if raw.trim().is_empty() {
                continue;
            }
            let at = || format!("{} line {}", path.display(), i + 1);
            let v: Value = serde_json::from_str(raw).map_err(|e| format!("{}: not JSON: {e}", at()))?;
            let Value::Object(o) = v else {
                return Err(format!("{}: expected a JSON object (a line of `assay eval --out`)", at()));
            };
            let id = match o.get("id") {
                Some(Value::String(s)) if !s.is_empty() => s.clone(),
                Some(Value::Number(n)) => n.to_string(),
                _ => return Err(format!("{}: no record \"id\" (a non-empty string)", at())),
            };
            let field = metric.field();
            let score = match o.get(field) {
                Some(Value::Number(n)) => match n.as_f64().filter(|x| x.is_finite()) {
                    Some(x) => Some(x),
                    None => return Err(format!("{}: {field:?} is not a finite number", at())),
                },
                Some(Value::Null) => None,
                None => {
                    return Err(format!(
                        "{}: no {field:?} field (--metric {}; is this a file written by `assay eval --out`?)",
                        at(),
                        field.trim_end_matches("_score")
                    ));
                }
                Some(other) => return Err(format!("{}: {field:?} must be a number or null, got {other}", at())),
            };
            let questions = o.get("questions").and_then(Value::as_object);
            let answers = o
                .get("answers")
                .and_then(Value::as_object)
                .map(|a| {
                    a.iter()
                        .filter_map(|(item, ans)| {
                            let yes = match ans.as_str()? {
                                "yes" => true,
                                "no" => false,
                                _ => return None,
                            };
                            let key = questions
                                .and_then(|q| q.get(item))
                                .and_then(Value::as_str)
                                .map_or_else(|| item.clone(), str::to_string);
                            Some((key, yes))
                        })
                        .collect()
                })
                .unwrap_or_default();
            lines.push(Line { id, score, answers });
        }
        Ok(Self { path: path.to_path_buf(), lines })
    }

    /// Scored observations `(id, score)`, repeats kept (they are samples of one record).
    fn observations(&self) -> Vec<(&str, f64)> {
        self.lines.iter().filter_map(|l| l.score.map(|s| (l.id.as_str(), s))).collect()
    }

    /// Per-record mean scores.
    fn means(&self) -> BTreeMap<&str, f64> {
        let mut by: BTreeMap<&str, (f64, usize)> = BTreeMap::new();
        for (id, s) in self.observations() {
            let e = by.entry(id).or_insert((0.0, 0));
            e.0 += s;
            e.1 += 1;
        }
        by.into_iter().map(|(k, (s, n))| (k, s / n as f64)).collect()
    }

    fn ids(&self) -> BTreeSet<&str> {
        self.lines.iter().map(|l| l.id.as_str()).collect()
    }

    /// Records without a score on any line.
    fn unscored(&self) -> Vec<&str> {
        let scored: BTreeSet<&str> = self.lines.iter().filter(|l| l.score.is_some()).map(|l| l.id.as_str()).collect();
        self.ids().into_iter().filter(|id| !scored.contains(id)).collect()
    }

    /// The first line of each record (its checklist answers).
    fn first_lines(&self) -> BTreeMap<&str, &Line> {
        let mut m = BTreeMap::new();
        for l in &self.lines {
            m.entry(l.id.as_str()).or_insert(l);
        }
        m
    }
}

/// How often one checklist item flipped across the shared records.
struct ItemFlips {
    item: String,
    compared: usize,
    yes_to_no: usize,
    no_to_yes: usize,
}

/// Everything `assay compare` reports.
struct Report {
    metric: Metric,
    comparison: Comparison,
    bootstrap: Option<BootstrapInterval>,
    items: Vec<ItemFlips>,
    /// (id, baseline mean, candidate mean), most negative difference first.
    worst: Vec<(String, f64, f64)>,
    baseline_only: Vec<String>,
    candidate_only: Vec<String>,
    unscored_baseline: Vec<String>,
    unscored_candidate: Vec<String>,
}

/// Run `assay compare`: 0 done (no significant regression under the gate), 1 a regression under
/// `--fail-on-regression`, 2 bad input.
pub fn run(args: CompareArgs) -> ExitCode {
    match report(&args) {
        Err(e) => {
            eprintln!("assay compare: {e}");
            ExitCode::from(EXIT_BAD_INPUT)
        }
        Ok(r) => {
            let gate = args.fail_on_regression.then(|| gate(&r, args.min_effect.unwrap_or(0.0)));
            if args.json {
                println!("{}", to_json(&r, gate.as_ref()));
            } else {
                print!("{}", table(&r, &args));
            }
            match gate {
                Some((regressed, why)) => {
                    eprintln!("{why}");
                    if regressed { ExitCode::from(EXIT_REGRESSION) } else { ExitCode::SUCCESS }
                }
                None => ExitCode::SUCCESS,
            }
        }
    }
}

fn report(args: &CompareArgs) -> Result<Report, String> {
    if !(args.alpha > 0.0 && args.alpha < 1.0) {
        return Err(format!("--alpha must be in (0, 1), got {}", args.alpha));
    }
    if let Some(m) = args.min_effect
        && !(m.is_finite() && m >= 0.0)
    {
        return Err(format!("--min-effect must be a finite number >= 0, got {m}"));
    }
    let base = Results::read(&args.baseline, args.metric)?;
    let cand = Results::read(&args.candidate, args.metric)?;
    let (bm, cm) = (base.means(), cand.means());
    let shared: Vec<&str> = bm.keys().filter(|k| cm.contains_key(*k)).copied().collect();
    if shared.is_empty() {
        return Err(format!(
            "no shared records: {} ({} scored) and {} ({} scored) have no scored record id in common",
            base.path.display(),
            bm.len(),
            cand.path.display(),
            cm.len()
        ));
    }
    let comparison = stats::compare(&cand.observations(), &base.observations(), args.alpha)
        .map_err(|e| format!("cannot compare: {e}"))?;
    let bootstrap = if comparison.paired {
        let diffs: Vec<f64> = comparison.pairs.iter().map(|(_, a, b)| a - b).collect();
        stats::paired_bootstrap(&diffs, args.alpha, BOOTSTRAP_RESAMPLES, args.seed)
    } else {
        None
    };
    let mut worst: Vec<(String, f64, f64)> =
        shared.iter().map(|id| ((*id).to_string(), bm[id], cm[id])).filter(|(_, b, c)| c < b).collect();
    worst.sort_by(|x, y| (x.2 - x.1).total_cmp(&(y.2 - y.1)).then_with(|| x.0.cmp(&y.0)));
    worst.truncate(WORST);
    let (bids, cids) = (base.ids(), cand.ids());
    Ok(Report {
        metric: args.metric,
        items: flips(&base, &cand),
        bootstrap,
        worst,
        baseline_only: bids.difference(&cids).map(|s| (*s).to_string()).collect(),
        candidate_only: cids.difference(&bids).map(|s| (*s).to_string()).collect(),
        unscored_baseline: base.unscored().into_iter().map(str::to_string).collect(),
        unscored_candidate: cand.unscored().into_iter().map(str::to_string).collect(),
        comparison,
    })
}

/// Per item (question text, else item id) over the records in both files: yes->no and no->yes.
fn flips(base: &Results, cand: &Results) -> Vec<ItemFlips> {
    let (bl, cl) = (base.first_lines(), cand.first_lines());
    let mut by: BTreeMap<&str, ItemFlips> = BTreeMap::new();
    for (id, b) in &bl {
        let Some(c) = cl.get(id) else { continue };
        for (item, yes_b) in &b.answers {
            let Some(yes_c) = c.answers.get(item) else { continue };
            let e = by.entry(item.as_str()).or_insert_with(|| ItemFlips {
                item: item.clone(),
                compared: 0,
                yes_to_no: 0,
                no_to_yes: 0,
            });
            e.compared += 1;
            e.yes_to_no += usize::from(*yes_b && !yes_c);
            e.no_to_yes += usize::from(!yes_b && *yes_c);
        }
    }
    let mut items: Vec<ItemFlips> = by.into_values().collect();
    items.sort_by(|x, y| y.yes_to_no.cmp(&x.yes_to_no).then(y.no_to_yes.cmp(&x.no_to_yes)).then(x.item.cmp(&y.item)));
    items
}

/// (regressed, the line saying why).
fn gate(r: &Report, min_effect: f64) -> (bool, String) {
    let c = &r.comparison;
    let conf = 100.0 * (1.0 - c.alpha);
    let interval = format!("diff {:+.4}, {conf:.0}% CI [{:+.4}, {:+.4}]", c.diff, c.ci.0, c.ci.1);
    if c.ci.1 < -min_effect {
        (true, format!("regression: {interval} lies entirely below -{min_effect} ({})", c.method.as_str()))
    } else {
        (false, format!("no significant regression: {interval} does not lie entirely below -{min_effect}"))
    }
}

fn to_json(r: &Report, gate: Option<&(bool, String)>) -> Value {
    let c = &r.comparison;
    json!({
        "metric": r.metric.field(),
        "method": c.method.as_str(),
        "paired": c.paired,
        "alpha": c.alpha,
        "n_pairs": c.n_pairs,
        "n_baseline": c.n_records_b,
        "n_candidate": c.n_records_a,
        "mean_baseline": c.mean_b,
        "mean_candidate": c.mean_a,
        "diff": c.diff,
        "ci_low": c.ci.0,
        "ci_high": c.ci.1,
        "p_value": c.p_value,
        "significant": c.significant(),
        "variance_reduction": c.variance_reduction,
        "effective_n": c.effective_n,
        "n_discordant": c.n_discordant,
        "odds_ratio": c.odds_ratio,
        "ci_odds_ratio": c.ci_odds_ratio.map(|(l, h)| json!([l, h])),
        "bootstrap_ci_low": r.bootstrap.map(|b| b.low),
        "bootstrap_ci_high": r.bootstrap.map(|b| b.high),
        "bootstrap_resamples": r.bootstrap.map(|b| b.resamples),
        "bootstrap_seed": r.bootstrap.map(|b| b.seed),
        "warnings": c.warnings,
        "notes": c.notes,
        "items": r.items.iter().map(|i| json!({
            "item": i.item, "compared": i.compared, "yes_to_no": i.yes_to_no, "no_to_yes": i.no_to_yes,
        })).collect::<Vec<_>>(),
        "worst_regressions": r.worst.iter().map(|(id, b, c)| json!({
            "id": id, "baseline": b, "candidate": c, "diff": c - b,
        })).collect::<Vec<_>>(),
        "unmatched": {"baseline_only": r.baseline_only, "candidate_only": r.candidate_only},
        "unscored": {"baseline": r.unscored_baseline, "candidate": r.unscored_candidate},
        "regression": gate.map(|g| g.0),
        "gate": gate.map(|g| g.1.clone()),
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

fn table(r: &Report, args: &CompareArgs) -> String {
    use std::fmt::Write;
    let c = &r.comparison;
    let conf = format!("{:.0}%", 100.0 * (1.0 - c.alpha));
    let mut s = String::new();
    let _ = writeln!(s, "{} (candidate - baseline), {}", r.metric.field(), c.method.as_str());
    let _ = writeln!(s, "  {:<11} {:>10}  {:>8}  file", "", "records", "mean");
    let _ = writeln!(s, "  {:<11} {:>10}  {:>8.4}  {}", "baseline", c.n_records_b, c.mean_b, args.baseline.display());
    let _ = writeln!(s, "  {:<11} {:>10}  {:>8.4}  {}", "candidate", c.n_records_a, c.mean_a, args.candidate.display());
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
        for (id, b, cd) in &r.worst {
            let _ = writeln!(s, "  {id}: {b:.4} -> {cd:.4} ({:+.4})", cd - b);
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
