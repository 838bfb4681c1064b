//! `assay agreement --labels GOLD RESULTS`: how well the judge of an `assay eval --out` file agrees
//! with human (gold) labels, per checklist item (accuracy, Cohen's kappa, Krippendorff's alpha, the
//! confusion table) and per record score (mean absolute difference, Krippendorff's alpha), and the
//! judge's mean score corrected by the labels (prediction-powered inference) beside the judge-only
//! and the gold-only means, with the statistics of [`assay_domain::stats::agreement`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use assay_domain::stats::agreement::{Confusion, MeanInterval, PredictionPowered, prediction_powered_mean};
use assay_domain::stats::krippendorff::{self, Level};
use serde_json::{Value, json};

use super::error::{CliError, Ending, Outcome};
use super::source::{self, Metric, label, record_id};

/// Options of `assay agreement`.
#[derive(clap::Args, Clone, Debug)]
pub struct AgreementArgs {
    /// Gold labels, JSON lines: `{"id": "...", "score": 0.8}` (a record's score) and/or
    /// `{"id": "...", "items": {"item id or question text": "yes" | "no"}}` (its items).
    #[arg(long)]
    pub labels: PathBuf,
    /// Judged results: a JSON-lines file written by `assay eval --out`, or the id of a
    /// checklist_eval run in the gateway's store.
    pub results: String,
    /// Gateway address for a run id (default: the configured gateway port on this machine).
    #[arg(long)]
    pub gateway: Option<String>,
    /// The per-record score the gold `score` labels are compared with.
    #[arg(long, value_enum, default_value = "primary")]
    pub metric: Metric,
    /// Significance level of the intervals (they are at 1 - alpha); not Krippendorff's alpha.
    #[arg(long, default_value_t = 0.05)]
    pub alpha: f64,
    /// Print one JSON object instead of the text report.
    #[arg(long)]
    pub json: bool,
}

/// One gold line.
struct Gold {
    line: usize,
    id: String,
    score: Option<f64>,
    items: Vec<(String, bool)>,
}

fn read_gold(path: &Path) -> Result<Vec<Gold>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut gold = Vec::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (i, raw) in text.lines().enumerate() {
        if raw.trim().is_empty() {
            continue;
        }
        let line = i + 1;
        let at = || format!("{} line {line}", path.display());
        let Ok(Value::Object(o)) = serde_json::from_str::<Value>(raw) else {
            return Err(format!("{}: expected a JSON object {{\"id\", \"score\"}} or {{\"id\", \"items\"}}", at()));
        };
        let id = record_id(o.get("id")).ok_or_else(|| format!("{}: no record \"id\" (a non-empty string)", at()))?;
        if let Some(first) = seen.insert(id.clone(), line) {
            return Err(format!("{}: record {id:?} is labelled again (first on line {first})", at()));
        }
        let score = match o.get("score") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_f64().filter(|x| x.is_finite()) {
                Some(x) => Some(x),
                None => return Err(format!("{}: \"score\" must be a finite number, got {v}", at())),
            },
        };
        let mut items = Vec::new();
        match o.get("items") {
            None | Some(Value::Null) => {}
            Some(Value::Object(m)) => {
                for (item, ans) in m {
                    let yes = match ans.as_str() {
                        Some("yes") => true,
                        Some("no") => false,
                        Some(_) | None => {
                            return Err(format!(
                                "{}: item {item:?} must be labelled \"yes\" or \"no\", got {ans}",
                                at()
                            ));
                        }
                    };
                    items.push((item.clone(), yes));
                }
            }
            Some(other) => {
                return Err(format!("{}: \"items\" must be an object of item -> \"yes\"/\"no\", got {other}", at()));
            }
        }
        if score.is_none() && items.is_empty() {
            return Err(format!("{}: a label needs a \"score\" or a non-empty \"items\"", at()));
        }
        gold.push(Gold { line, id, score, items });
    }
    if gold.is_empty() {
        return Err(format!("{}: no labels", path.display()));
    }
    Ok(gold)
}

/// The mean estimates of one quantity (record score, or item yes-share).
struct Estimate {
    quantity: String,
    n_judged: usize,
    n_labelled: usize,
    result: PredictionPowered,
}

/// Everything `assay agreement` reports.
struct Report {
    metric: Metric,
    alpha: f64,
    records_judged: usize,
    records_labelled: usize,
    /// Item labels compared (judge answered), and their table.
    confusion: Option<Confusion>,
    items_alpha: Option<Result<f64, krippendorff::Undefined>>,
    /// Labelled items the judge left unanswered.
    items_unanswered: usize,
    /// Labelled records with a gold score and a judge score: (mean |judge - gold|, alpha).
    scores: Option<(usize, f64, Result<f64, krippendorff::Undefined>)>,
    /// Labelled records the judge did not score (failed).
    unscored_labelled: Vec<String>,
    estimates: Vec<Estimate>,
    notes: Vec<String>,
}

/// Run `assay agreement`: 0 done, 2 bad input.
pub fn run(args: AgreementArgs) -> Outcome {
    let r = report(&args).map_err(CliError::BadInput)?;
    if args.json {
        outln!("{}", to_json(&r, &args));
    } else {
        out!("{}", text(&r, &args));
    }
    Ok(Ending::Done)
}

fn report(args: &AgreementArgs) -> Result<Report, String> {
    if !(args.alpha > 0.0 && args.alpha < 1.0) {
        return Err(format!("--alpha must be in (0, 1), got {}", args.alpha));
    }
    let gold = read_gold(&args.labels)?;
    let results = source::load(&args.results, args.gateway.as_deref(), args.metric.run_metric())?;
    if results.records.is_empty() {
        return Err(format!("{}: no records", label(&args.results)));
    }
    // Per record: the mean judge score over its lines and samples, and its first line (the item
    // answers).
    let judge_score = results.means();
    let first = results.first_lines();

    let mut score_pairs: Vec<(f64, f64)> = Vec::new();
    let mut item_pairs: Vec<(bool, bool)> = Vec::new();
    let mut items_unanswered = 0;
    let mut unscored_labelled = Vec::new();
    for g in &gold {
        let Some(record) = first.get(g.id.as_str()) else {
            return Err(format!(
                "{} line {}: record {:?} is not in {}",
                args.labels.display(),
                g.line,
                g.id,
                label(&args.results)
            ));
        };
        if let Some(gs) = g.score {
            match judge_score.get(g.id.as_str()) {
                Some(js) => score_pairs.push((*js, gs)),
                None => unscored_labelled.push(g.id.clone()),
            }
        }
        for (key, gold_yes) in &g.items {
            let judged = record.answers.get(key).or_else(|| {
                record.questions.iter().find(|(_, text)| *text == key).and_then(|(item, _)| record.answers.get(item))
            });
            match judged {
                Some(Some(judge_yes)) => item_pairs.push((*judge_yes, *gold_yes)),
                Some(None) => items_unanswered += 1,
                None => {
                    return Err(format!(
                        "{} line {}: record {:?} has no item {key:?} (by item id or question text) in {}",
                        args.labels.display(),
                        g.line,
                        g.id,
                        label(&args.results)
                    ));
                }
            }
        }
    }

    let mut notes = Vec::new();
    let mut estimates = Vec::new();
    if score_pairs.len() >= 2 {
        let judged: Vec<f64> = judge_score.values().copied().collect();
        let result = prediction_powered_mean(&judged, &score_pairs, args.alpha).map_err(|e| e.to_string())?;
        estimates.push(Estimate {
            quantity: args.metric.field().to_string(),
            n_judged: judged.len(),
            n_labelled: score_pairs.len(),
            result,
        });
    } else if !score_pairs.is_empty() {
        notes.push("fewer than 2 records carry both a gold and a judge score: no corrected mean score".into());
    }
    // The item yes-share only without score labels: its interval treats the items of a record as
    // independent, so the record score (records independent) is the better quantity when labelled.
    if estimates.is_empty() && item_pairs.len() >= 2 {
        let judged: Vec<f64> =
            first.values().flat_map(|l| l.answers.values().flatten().map(|yes| f64::from(u8::from(*yes)))).collect();
        let labelled: Vec<(f64, f64)> =
            item_pairs.iter().map(|(j, g)| (f64::from(u8::from(*j)), f64::from(u8::from(*g)))).collect();
        let result = prediction_powered_mean(&judged, &labelled, args.alpha).map_err(|e| e.to_string())?;
        estimates.push(Estimate {
            quantity: "item_yes_share".to_string(),
            n_judged: judged.len(),
            n_labelled: labelled.len(),
            result,
        });
        notes.push(
            "item yes-share intervals treat the items as independent; items of one record are correlated, so \
             they may be too narrow"
                .into(),
        );
    }
    if estimates.is_empty() && item_pairs.is_empty() && score_pairs.is_empty() {
        return Err(format!(
            "no label of {} can be compared: every labelled record is unscored and every labelled item unanswered \
             in {}",
            args.labels.display(),
            label(&args.results)
        ));
    }
    if !estimates.is_empty() {
        notes.push(
            "the corrected (prediction-powered) mean is unbiased only when the labelled records are a random \
             sample of the judged ones"
                .into(),
        );
    }
    let confusion = (!item_pairs.is_empty()).then(|| Confusion::from_pairs(item_pairs.iter().copied()));
    let scores = (!score_pairs.is_empty()).then(|| {
        let mae = score_pairs.iter().map(|(j, g)| (j - g).abs()).sum::<f64>() / score_pairs.len() as f64;
        let data = [
            score_pairs.iter().map(|(j, _)| Some(*j)).collect::<Vec<_>>(),
            score_pairs.iter().map(|(_, g)| Some(*g)).collect(),
        ];
        (score_pairs.len(), mae, krippendorff::alpha(&data, Level::Interval))
    });
    let records_labelled = gold.iter().map(|g| g.id.as_str()).collect::<BTreeSet<_>>().len();
    Ok(Report {
        metric: args.metric,
        alpha: args.alpha,
        records_judged: first.len(),
        records_labelled,
        items_alpha: confusion.map(|c| c.krippendorff_alpha()),
        confusion,
        items_unanswered,
        scores,
        unscored_labelled,
        estimates,
        notes,
    })
}

fn interval_json(m: &MeanInterval) -> Value {
    json!({"mean": m.mean, "se": m.se, "ci_low": m.ci.0, "ci_high": m.ci.1, "n": m.n})
}

fn alpha_json(a: Option<&Result<f64, krippendorff::Undefined>>) -> Value {
    match a {
        Some(Ok(x)) => json!(x),
        Some(Err(_)) | None => Value::Null,
    }
}

fn to_json(r: &Report, args: &AgreementArgs) -> Value {
    let items = r.confusion.map(|c| {
        json!({
            "n": c.n(),
            "accuracy": c.accuracy(),
            "kappa": c.kappa(),
            "krippendorff_alpha": alpha_json(r.items_alpha.as_ref()),
            "unanswered_by_judge": r.items_unanswered,
            "confusion": {
                "judge_yes_gold_yes": c.yes_yes,
                "judge_yes_gold_no": c.yes_no,
                "judge_no_gold_yes": c.no_yes,
                "judge_no_gold_no": c.no_no,
            },
        })
    });
    let scores = r
        .scores
        .as_ref()
        .map(|(n, mae, a)| json!({"n": n, "mean_abs_diff": mae, "krippendorff_alpha": alpha_json(Some(a))}));
    json!({
        "labels": args.labels.display().to_string(),
        "results": label(&args.results),
        "metric": r.metric.field(),
        "alpha": r.alpha,
        "records_judged": r.records_judged,
        "records_labelled": r.records_labelled,
        "items": items,
        "scores": scores,
        "unscored_labelled": r.unscored_labelled,
        "estimates": r.estimates.iter().map(|e| json!({
            "quantity": e.quantity,
            "n_judged": e.n_judged,
            "n_labelled": e.n_labelled,
            "correction": e.result.correction,
            "ppi": interval_json(&e.result.ppi),
            "judge_only": interval_json(&e.result.judge_only),
            "gold_only": interval_json(&e.result.gold_only),
        })).collect::<Vec<_>>(),
        "notes": r.notes,
    })
}

fn alpha_text(a: &Result<f64, krippendorff::Undefined>) -> String {
    match a {
        Ok(x) => format!("{x:.3}"),
        Err(why) => format!("undefined ({why})"),
    }
}

fn text(r: &Report, args: &AgreementArgs) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} labelled of {} judged records ({} against {})",
        r.records_labelled,
        r.records_judged,
        args.labels.display(),
        label(&args.results)
    );
    if let Some(c) = r.confusion {
        let opt = |x: Option<f64>| x.map_or_else(|| "undefined".to_string(), |x| format!("{x:.3}"));
        let _ = writeln!(
            s,
            "items: {} labelled, accuracy {}, Cohen's kappa {}, Krippendorff's alpha (nominal) {}",
            c.n(),
            opt(c.accuracy()),
            opt(c.kappa()),
            r.items_alpha.as_ref().map_or_else(String::new, alpha_text)
        );
        let _ = writeln!(s, "  {:<10} {:>9} {:>9}", "", "gold yes", "gold no");
        let _ = writeln!(s, "  {:<10} {:>9} {:>9}", "judge yes", c.yes_yes, c.yes_no);
        let _ = writeln!(s, "  {:<10} {:>9} {:>9}", "judge no", c.no_yes, c.no_no);
        if r.items_unanswered > 0 {
            let _ = writeln!(s, "  {} labelled items left unanswered by the judge (not counted)", r.items_unanswered);
        }
    }
    if let Some((n, mae, a)) = &r.scores {
        let _ = writeln!(
            s,
            "scores ({}): {n} labelled, mean |judge - gold| {mae:.4}, Krippendorff's alpha (interval) {}",
            r.metric.field(),
            alpha_text(a)
        );
    }
    if !r.unscored_labelled.is_empty() {
        let _ = writeln!(
            s,
            "labelled records the judge did not score ({}): {}",
            r.unscored_labelled.len(),
            r.unscored_labelled.join(", ")
        );
    }
    let conf = format!("{:.0}%", 100.0 * (1.0 - r.alpha));
    for e in &r.estimates {
        let _ = writeln!(s, "mean {}, {conf} CI:", e.quantity);
        let row = |name: &str, m: &MeanInterval, what: String| {
            format!("  {name:<19} {:.4} [{:.4}, {:.4}]  {what}\n", m.mean, m.ci.0, m.ci.1)
        };
        s.push_str(&row(
            "prediction-powered",
            &e.result.ppi,
            format!(
                "judge on {} values corrected by {} gold labels ({:+.4})",
                e.n_judged, e.n_labelled, e.result.correction
            ),
        ));
        s.push_str(&row("judge only", &e.result.judge_only, format!("{} values, biased if the judge is", e.n_judged)));
        s.push_str(&row("gold only", &e.result.gold_only, format!("{} labelled values", e.n_labelled)));
    }
    for n in &r.notes {
        let _ = writeln!(s, "note: {n}");
    }
    s
}
