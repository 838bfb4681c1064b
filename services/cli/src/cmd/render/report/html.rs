//! A report as one self-contained HTML page: inline CSS, inline SVG, and one small inline script
//! that pages the records past the first page (which is written as HTML, so it shows without the
//! script). The page's Content-Security-Policy allows only that stylesheet and that script (by
//! their sha256), nothing from the network. Every text from a run is escaped ([`esc`]); the
//! records past the first page travel as JSON in a data block (`<` written `\u003c`) and the
//! script builds their rows with `textContent`.

use std::fmt::Write as _;

use assay_proto::common::v1 as common;
use assay_proto::gateway::v1 as gw;
use assay_proto::refiners::v1 as rpb;
use base64::Engine as _;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::svg::{self, Row, esc};
use super::{
    IssueEnd, Records, Report, SectionView, answer_letter, clip, count, decision, diff, level, method, p_value, pct,
    primary, questions, run_error, score, tokens, verdict,
};
use crate::cmd::render::{
    action_name, cost_text, kind_name, outcome_name, plural, quality_name, severity_name, state_name,
};

/// Records written as HTML rows per page; past the first page the inline script builds them.
pub const PAGE: usize = 1000;
/// Checklists listed (one per distinct input; the records name theirs).
const CHECKLISTS_SHOWN: usize = 50;

/// JSON for a `<script type="application/json">` block: `<`, `>` and `&` as `\u` escapes, so no
/// text inside can close the block (they only occur inside JSON strings, where escapes are valid).
fn json_block(v: &Value) -> String {
    v.to_string().replace('<', "\\u003c").replace('>', "\\u003e").replace('&', "\\u0026")
}

/// `'sha256-…'` of an inline stylesheet or script, for the Content-Security-Policy.
fn csp_hash(text: &str) -> String {
    format!("'sha256-{}'", base64::engine::general_purpose::STANDARD.encode(Sha256::digest(text.as_bytes())))
}

/// The whole page.
pub fn render(r: &Report) -> String {
    let run = &r.run;
    let kind = kind_name(run.kind);
    let mut body = String::new();
    body.push_str(&what_ran(r));
    match run.result.as_ref().and_then(|x| x.result.as_ref()) {
        Some(gw::run_result::Result::ChecklistEval(e)) => body.push_str(&checklist_eval(r, e)),
        Some(gw::run_result::Result::TargetedRefinement(t)) => body.push_str(&refinement(r, t)),
        Some(gw::run_result::Result::Debate(d)) => body.push_str(&debate(d)),
        Some(gw::run_result::Result::SelfRefine(s)) => body.push_str(&self_refine(s)),
        Some(gw::run_result::Result::Checklist(c)) => {
            body.push_str(&panel("checklist", "Checklist", &checklists(std::slice::from_ref(c))));
        }
        None => body.push_str(&panel("no-result", "Result", "<p class=\"muted\">The run holds no result.</p>")),
    }
    let csp = format!(
        "default-src 'none'; style-src {}; script-src {}; base-uri 'none'; form-action 'none'",
        csp_hash(CSS),
        csp_hash(SCRIPT)
    );
    let title = format!("Assay report · {kind} · {}", run.run_id);
    format!(
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"{csp}\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <meta name=\"generator\" content=\"assay {version}\">\n<title>{title}</title>\n<style>{CSS}</style>\n</head>\n\
         <body>\n<header class=\"top\"><h1>Assay report</h1><p class=\"sub\">{kind_h} run <code id=\"run-id\">{id}</code> · \
         <span class=\"badge\" data-state=\"{state}\" id=\"run-state\">{state}</span>{label}</p></header>\n\
         <main id=\"report\" data-kind=\"{kind_h}\" data-run-id=\"{id}\">\n{body}</main>\n\
         <footer class=\"muted\">Written by <code>assay report</code> {version} from the gateway's record of the run; \
         this file loads nothing from the network.</footer>\n<script>{SCRIPT}</script>\n</body>\n</html>\n",
        version = env!("CARGO_PKG_VERSION"),
        title = esc(&title),
        kind_h = esc(&kind),
        id = esc(&run.run_id),
        state = esc(&state_name(run.state)),
        label = if run.label.is_empty() { String::new() } else { format!(" · {}", esc(&run.label)) },
    )
}

fn panel(id: &str, title: &str, inner: &str) -> String {
    format!("<section class=\"panel\" id=\"{id}\"><h2>{}</h2>\n{inner}</section>\n", esc(title))
}

/// `<dl>` of terms and values; the values are HTML already, empty ones are left out.
fn kv(id: &str, pairs: &[(&str, String)]) -> String {
    let mut s = format!("<dl class=\"kv\" id=\"{id}\">");
    for (term, value) in pairs.iter().filter(|(_, v)| !v.is_empty()) {
        let _ = write!(s, "<dt>{}</dt><dd>{value}</dd>", esc(term));
    }
    s.push_str("</dl>\n");
    s
}

/// A table; the rows are HTML already.
fn table(id: &str, headers: &[&str], rows: &[String]) -> String {
    let head: String = headers.iter().map(|h| format!("<th scope=\"col\">{}</th>", esc(h))).collect();
    format!(
        "<div class=\"table-wrap\"><table class=\"grid\" id=\"{id}\"><thead><tr>{head}</tr></thead><tbody>{}</tbody></table></div>\n",
        rows.concat()
    )
}

fn td_num(v: &str) -> String {
    format!("<td class=\"num\">{}</td>", esc(v))
}

fn td_text(v: &str) -> String {
    format!("<td class=\"text\">{}</td>", esc(v))
}

fn code(v: &str) -> String {
    format!("<code>{}</code>", esc(v))
}

/// A contract timestamp to the second (`2026-12-03 18:06:28 UTC`), or nothing.
fn when<T: std::fmt::Display>(t: Option<&T>) -> String {
    t.map(|t| {
        let rfc3339 = t.to_string();
        let seconds = rfc3339.split(['.', 'Z']).next().unwrap_or_default();
        esc(&format!("{} UTC", seconds.replace('T', " ")))
    })
    .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// What ran
// ---------------------------------------------------------------------------------------------

fn usage_text(u: &common::Usage) -> String {
    let mut parts = vec![format!("{} calls", count(u64::from(u.calls))), format!("{} tokens", count(tokens(u)))];
    if u.cache_hits > 0 {
        parts.push(format!("{} cache hits", count(u64::from(u.cache_hits))));
    }
    if u.retries > 0 {
        parts.push(format!("{} retries", count(u64::from(u.retries))));
    }
    parts.push(cost_text(u));
    esc(&parts.join(" · "))
}

fn what_ran(r: &Report) -> String {
    let run = &r.run;
    let u = run.usage.clone().unwrap_or_default();
    let budget = run.budget.as_ref().map(|b| {
        let mut parts = Vec::new();
        if let Some(t) = b.max_tokens {
            parts.push(format!("{} tokens", count(t)));
        }
        if let Some(c) = b.max_cost_usd {
            parts.push(format!("${c:.4}"));
        }
        esc(&parts.join(", "))
    });
    let records = match run.records_total {
        0 => String::new(),
        n => esc(&format!("{} of {} done", count(u64::from(run.records_done)), count(u64::from(n)))),
    };
    let mut s = kv(
        "what-ran-summary",
        &[
            ("Pipeline", esc(&kind_name(run.kind))),
            ("Run", code(&run.run_id)),
            ("State", esc(&state_name(run.state))),
            (
                "Error",
                if run_error(run).is_empty() {
                    String::new()
                } else {
                    format!("<span class=\"error-text\">{}</span>", esc(run_error(run)))
                },
            ),
            ("Label", esc(&run.label)),
            ("Created", when(run.created_at.as_ref())),
            ("Last update", when(run.updated_at.as_ref())),
            ("Progress", records),
            ("Usage", usage_text(&u)),
            ("Budget", budget.unwrap_or_default()),
            ("Budget exhausted", esc(&run.budget_exhausted)),
        ],
    );
    s.push_str(&settings(r));
    let models = models(run);
    if !models.is_empty() {
        let rows: Vec<String> = models
            .iter()
            .map(|m| {
                format!(
                    "<tr class=\"model\">{}{}{}{}{}{}{}</tr>",
                    td_text(&m.phase),
                    td_text(&m.backend),
                    td_text(&m.model),
                    td_num(&m.temperature.map_or_else(|| "-".into(), |t| format!("{t}"))),
                    td_num(&m.seed.map_or_else(|| "-".into(), |t| t.to_string())),
                    td_num(&if m.max_tokens == 0 { "-".into() } else { m.max_tokens.to_string() }),
                    td_text(&m.structured_output),
                )
            })
            .collect();
        s.push_str("<h3>Models</h3>\n");
        s.push_str(&table(
            "models",
            &["Phase", "Backend", "Model", "Temperature", "Seed", "Max tokens", "Structured output"],
            &rows,
        ));
    }
    if !run.audit_log.is_empty() {
        let rows: Vec<String> = run
            .audit_log
            .iter()
            .map(|a| {
                format!(
                    "<tr><td>{}</td>{}{}{}</tr>",
                    when(a.time.as_ref()),
                    td_text(&a.actor),
                    td_text(&a.action),
                    td_text(&a.detail)
                )
            })
            .collect();
        s.push_str("<h3>Controls</h3>\n");
        s.push_str(&table("audit", &["Time", "Actor", "Action", "Detail"], &rows));
    }
    panel("what-ran", "What ran", &s)
}

/// The exact models of the run (one line per distinct phase and settings).
fn models(run: &gw::Run) -> Vec<common::ModelRecord> {
    let mut all: Vec<common::ModelRecord> = match run.result.as_ref().and_then(|x| x.result.as_ref()) {
        Some(gw::run_result::Result::ChecklistEval(e)) => e.models.clone(),
        Some(gw::run_result::Result::TargetedRefinement(t)) => t.models.clone(),
        Some(gw::run_result::Result::SelfRefine(s)) => s.model.iter().cloned().collect(),
        Some(gw::run_result::Result::Debate(d)) => d
            .problems
            .iter()
            .filter_map(|p| p.debate.as_ref())
            .flat_map(|x| {
                let solve = x.solutions.iter().filter_map(|s| s.model.clone());
                let review = x.rounds.iter().flat_map(|r| r.reviews.iter().filter_map(|v| v.model.clone()));
                let refine = x.rounds.iter().flat_map(|r| r.refined.iter().filter_map(|v| v.model.clone()));
                let judge = x.judgment.iter().filter_map(|j| j.model.clone());
                solve.chain(review).chain(refine).chain(judge).collect::<Vec<_>>()
            })
            .collect(),
        Some(gw::run_result::Result::Checklist(_)) | None => Vec::new(),
    };
    let mut seen = Vec::new();
    all.retain(|m| {
        let key = (m.phase.clone(), m.backend.clone(), m.model.clone(), m.temperature.map(f64::to_bits), m.seed);
        if seen.contains(&key) {
            false
        } else {
            seen.push(key);
            true
        }
    });
    all
}

/// What the result says of the settings (the gateway keeps the run's result, not its request).
fn settings(r: &Report) -> String {
    let run = &r.run;
    let pairs: Vec<(&str, String)> = match run.result.as_ref().and_then(|x| x.result.as_ref()) {
        Some(gw::run_result::Result::ChecklistEval(e)) => {
            let methods: std::collections::BTreeSet<&str> =
                e.checklists.iter().map(|c| c.source_method.as_str()).filter(|m| !m.is_empty()).collect();
            let first = r.records.shown.iter().find_map(|x| x.score.as_ref());
            let samples =
                r.records.shown.iter().filter_map(|x| x.score.as_ref()).map(|s| s.sample_primary_scores.len()).max();
            let metric = first.map(|s| {
                common::PrimaryMetric::try_from(s.primary_metric)
                    .map(|m| crate::cmd::render::lower(m.as_str_name(), "PRIMARY_METRIC_"))
                    .unwrap_or_default()
            });
            vec![
                (
                    "Checklists",
                    if e.checklists.is_empty() {
                        String::new()
                    } else {
                        esc(&format!(
                            "{}{}",
                            plural(e.checklists.len(), "checklist"),
                            if methods.is_empty() {
                                String::new()
                            } else {
                                format!(" ({})", methods.into_iter().collect::<Vec<_>>().join(", "))
                            }
                        ))
                    },
                ),
                ("Primary metric", esc(&metric.unwrap_or_default())),
                ("Judge samples per record", samples.filter(|n| *n > 1).map(|n| n.to_string()).unwrap_or_default()),
                (
                    "Responders",
                    if e.responders.is_empty() {
                        String::new()
                    } else {
                        esc(&e.responders.iter().map(|x| x.name.as_str()).collect::<Vec<_>>().join(", "))
                    },
                ),
                (
                    "Stop when decided",
                    e.sequential.as_ref().map(|q| esc(&format!("yes (order seed {})", q.seed))).unwrap_or_default(),
                ),
            ]
        }
        Some(gw::run_result::Result::TargetedRefinement(t)) => {
            let p = match &run.progress {
                Some(gw::run::Progress::Refinement(p)) => p.clone(),
                None => gw::RefinementProgress::default(),
            };
            let judges = r.refinement.iter().find_map(|e| match &e.event {
                Some(gw::refinement_event::Event::Judged(j)) => Some(j.judges.len()),
                Some(_) | None => None,
            });
            vec![
                ("Mode", if p.mode == 0 { String::new() } else { esc(&crate::cmd::render::mode_name(p.mode)) }),
                ("Most iterations", if p.max_iterations == 0 { String::new() } else { p.max_iterations.to_string() }),
                ("Token budget", if p.token_limit == 0 { String::new() } else { count(p.token_limit) }),
                ("Judges", judges.map(|n| n.to_string()).unwrap_or_default()),
                ("Sections", t.sections.len().to_string()),
                ("Full regeneration", if t.full_regenerate { "yes".into() } else { String::new() }),
                ("Self-refine hook", if t.self_refined.is_empty() { String::new() } else { "yes".into() }),
            ]
        }
        Some(gw::run_result::Result::Debate(d)) => {
            let first = d.problems.iter().find_map(|p| p.debate.as_ref());
            let solvers =
                first.map(|x| x.solutions.iter().map(|s| s.solver_id.as_str()).collect::<Vec<_>>().join(", "));
            let rounds = d.problems.iter().filter_map(|p| p.debate.as_ref()).map(|x| x.rounds.len()).max();
            let baselines = d.problems.iter().any(|p| p.baselines.is_some());
            vec![
                ("Problems", count(u64::from(d.problems_total))),
                ("Solvers", esc(&solvers.unwrap_or_default())),
                ("Rounds run (most)", rounds.map(|n| n.to_string()).unwrap_or_default()),
                ("Baselines", if baselines { "yes".into() } else { String::new() }),
            ]
        }
        Some(gw::run_result::Result::SelfRefine(s)) => vec![
            ("Passes", s.passes.len().to_string()),
            ("Stop reason", esc(&crate::cmd::render::stop_reason_name(s.stop_reason))),
        ],
        Some(gw::run_result::Result::Checklist(_)) | None => Vec::new(),
    };
    if pairs.iter().all(|(_, v)| v.is_empty()) {
        return String::new();
    }
    format!("<h3>Settings</h3>\n{}", kv("settings", &pairs))
}

// ---------------------------------------------------------------------------------------------
// A checklist evaluation
// ---------------------------------------------------------------------------------------------

fn interval(u: Option<&common::ScoreUncertainty>) -> String {
    u.map(|u| format!("[{}, {}]", score(u.ci_low), score(u.ci_high))).unwrap_or_else(|| "-".into())
}

fn checklist_eval(r: &Report, e: &gw::EvaluateResponse) -> String {
    let mut s = String::new();
    s.push_str(&aggregates(r, e));
    if !e.responders.is_empty() {
        s.push_str(&responders(e));
    }
    if let Some(q) = &e.sequential {
        s.push_str(&sequential(q, &r.updates));
    }
    let q = questions(&e.checklists);
    s.push_str(&worst(&r.records, &q));
    s.push_str(&records(r, &q));
    if !e.checklists.is_empty() {
        let shown = &e.checklists[..e.checklists.len().min(CHECKLISTS_SHOWN)];
        let mut inner = checklists(shown);
        if e.checklists.len() > shown.len() {
            let _ = write!(
                inner,
                "<p class=\"muted\">The first {} of {} checklists.</p>",
                shown.len(),
                count(e.checklists.len() as u64)
            );
        }
        s.push_str(&panel("checklists", "Checklists", &inner));
    }
    s
}

fn aggregates(r: &Report, e: &gw::EvaluateResponse) -> String {
    let a = e.aggregate.clone().unwrap_or_default();
    let u = a.uncertainty.as_ref();
    let mean = match u {
        Some(u) => format!(
            "<span id=\"mean\">{}</span> <span class=\"muted\">{} interval</span> <span id=\"mean-ci\">{}</span>",
            score(a.mean_primary_score),
            level(u.alpha),
            interval(Some(u))
        ),
        None => format!("<span id=\"mean\">{}</span>", score(a.mean_primary_score)),
    };
    let observations = u.map(|u| {
        let clusters = if u.clusters > 0 {
            format!(" in {} clusters (records)", count(u64::from(u.clusters)))
        } else {
            String::new()
        };
        let se = match u.se_clustered {
            Some(c) => format!("standard error {c:.4} (clustered; {:.4} naive)", u.se_naive),
            None => format!("standard error {:.4}", u.se_naive),
        };
        esc(&format!("{} observations{clusters}; {se}", count(u64::from(u.observations))))
    });
    let what = if e.responders.is_empty() { "Records" } else { "Responses" };
    let results = format!(
        "<span id=\"results-total\">{}</span> (<span id=\"results-failed\">{}</span> without a score)",
        count(r.records.total),
        count(r.records.failed)
    );
    let mut s = kv(
        "aggregates",
        &[
            (what, results),
            (if e.responders.is_empty() { "Mean primary score" } else { "Mean primary score (every response)" }, mean),
            ("Uncertainty", observations.unwrap_or_default()),
            ("Macro pass rate", esc(&pct(a.macro_pass_rate))),
            ("Micro pass rate", esc(&pct(a.micro_pass_rate))),
            ("Unanswered items", count(u64::from(a.unanswered_items))),
            (
                "Unscored (no answer could be read)",
                if a.unscored_targets == 0 { String::new() } else { count(u64::from(a.unscored_targets)) },
            ),
            ("Stopped", esc(&e.budget_exhausted)),
        ],
    );
    if !a.category_pass_rates.is_empty() {
        let rows: Vec<String> = a
            .category_pass_rates
            .iter()
            .map(|c| {
                format!(
                    "<tr>{}{}{}</tr>",
                    td_text(&c.category),
                    td_num(&pct(c.pass_rate)),
                    td_num(&count(u64::from(c.items)))
                )
            })
            .collect();
        s.push_str(&table("categories", &["Category", "Pass rate", "Items answered"], &rows));
    }
    panel("aggregates-panel", "Aggregates", &s)
}

fn responders(e: &gw::EvaluateResponse) -> String {
    let rows: Vec<String> = e
        .responders
        .iter()
        .enumerate()
        .map(|(i, x)| {
            let a = x.aggregate.clone().unwrap_or_default();
            let u = x.usage.clone().unwrap_or_default();
            let model = x.model.as_ref().map(|m| m.model.clone()).unwrap_or_default();
            format!(
                "<tr class=\"responder\" data-responder=\"{}\"><td class=\"text\">{}{}</td>{}<td class=\"num mean\">{}</td>{}{}{}{}{}</tr>",
                esc(&x.name),
                esc(&x.name),
                if i == 0 { " <span class=\"tag\">baseline</span>" } else { "" },
                td_text(&model),
                if x.aggregate.is_some() { score(a.mean_primary_score) } else { "-".into() },
                td_num(&interval(a.uncertainty.as_ref())),
                td_num(&count(u64::from(x.responses))),
                td_num(&count(u64::from(x.failed))),
                td_num(&count(x.missing.len() as u64)),
                td_num(&count(tokens(&u))),
            )
        })
        .collect();
    let mut s = table(
        "responders",
        &[
            "Responder",
            "Model",
            "Mean primary",
            "95% interval",
            "Responses",
            "Failed",
            "Records missing",
            "Answering tokens",
        ],
        &rows,
    );
    if !e.comparisons.is_empty() {
        let forest_rows: Vec<Row> = e
            .comparisons
            .iter()
            .map(|c| Row {
                label: c.candidate_run_id.clone(),
                lo: c.ci_low,
                hi: c.ci_high,
                point: c.diff,
                class: "ci",
                data: vec![("candidate", c.candidate_run_id.clone())],
            })
            .collect();
        s.push_str(&svg::forest(
            &forest_rows,
            "responder-forest",
            140.0,
            "each responder against the baseline",
            "Each responder minus the baseline (primary score), with its interval; the dashed line is no difference.",
        ));
        let rows: Vec<String> = e
            .comparisons
            .iter()
            .map(|c| {
                format!(
                    "<tr class=\"comparison\" data-candidate=\"{}\">{}{}<td class=\"num diff\">{}</td>{}{}{}{}<td class=\"text verdict\">{}</td></tr>",
                    esc(&c.candidate_run_id),
                    td_text(&c.candidate_run_id),
                    td_text(&c.baseline_run_id),
                    diff(c.diff),
                    td_num(&format!("[{}, {}]", diff(c.ci_low), diff(c.ci_high))),
                    td_text(&method(c.method)),
                    td_num(&c.n_pairs.map_or_else(|| "-".into(), |n| count(u64::from(n)))),
                    td_num(&p_value(c.p_value)),
                    verdict(c),
                )
            })
            .collect();
        s.push_str(&table(
            "comparisons",
            &["Candidate", "Baseline", "Difference", "Interval", "Method", "Pairs", "p", "Verdict"],
            &rows,
        ));
        for c in &e.comparisons {
            s.push_str(&comparison_detail(c));
        }
    }
    panel("responders-panel", "Responders", &s)
}

/// A comparison's flipped items and worst records, folded.
fn comparison_detail(c: &gw::CompareRunsResponse) -> String {
    let flipped: Vec<&gw::CompareItemFlips> = c.items.iter().filter(|i| i.yes_to_no + i.no_to_yes > 0).collect();
    if flipped.is_empty() && c.worst_regressions.is_empty() && c.warnings.is_empty() {
        return String::new();
    }
    let mut s = format!(
        "<details class=\"comparison-detail\" data-candidate=\"{}\"><summary>{} against {}: items that flipped, records that got worse</summary>",
        esc(&c.candidate_run_id),
        esc(&c.candidate_run_id),
        esc(&c.baseline_run_id)
    );
    for w in &c.warnings {
        let _ = write!(s, "<p class=\"warn-text\">Warning: {}</p>", esc(w));
    }
    if !flipped.is_empty() {
        let rows: Vec<String> = flipped
            .iter()
            .map(|i| {
                format!(
                    "<tr>{}{}{}{}</tr>",
                    td_text(&i.item),
                    td_num(&i.yes_to_no.to_string()),
                    td_num(&i.no_to_yes.to_string()),
                    td_num(&i.compared.to_string())
                )
            })
            .collect();
        s.push_str(&table("", &["Item", "yes → no", "no → yes", "Records compared"], &rows));
    }
    if !c.worst_regressions.is_empty() {
        let rows: Vec<String> = c
            .worst_regressions
            .iter()
            .map(|w| {
                format!(
                    "<tr>{}{}{}{}</tr>",
                    td_text(&w.record_id),
                    td_num(&score(w.baseline)),
                    td_num(&score(w.candidate)),
                    td_num(&diff(w.diff))
                )
            })
            .collect();
        s.push_str(&table("", &["Record", "Baseline", "Candidate", "Difference"], &rows));
    }
    s.push_str("</details>\n");
    s
}

fn sequential(q: &gw::SequentialResult, updates: &[gw::ComparisonUpdated]) -> String {
    let last = gw::ComparisonUpdated { comparisons: q.comparisons.clone(), records_used: q.records_used };
    let steps: Vec<(&gw::ComparisonUpdated, bool)> =
        updates.iter().map(|u| (u, false)).chain(std::iter::once((&last, true))).collect();
    let rows: Vec<Row> = steps
        .iter()
        .flat_map(|(u, fin)| {
            u.comparisons.iter().map(move |c| {
                let mut data = vec![
                    ("candidate", c.candidate.clone()),
                    ("records", u.records_used.to_string()),
                    ("decision", decision(c.decision)),
                ];
                if *fin {
                    data.push(("final", "true".into()));
                }
                Row {
                    label: format!("{}, {}", c.candidate, plural(u.records_used as usize, "record")),
                    lo: c.low,
                    hi: c.high,
                    point: c.mean_difference,
                    class: if *fin { "ci final" } else { "ci" },
                    data,
                }
            })
        })
        .collect();
    let mut s = svg::forest(
        &rows,
        "sequential-forest",
        200.0,
        "the confidence sequence as it narrowed over the records",
        "Each candidate minus the baseline as its anytime-valid interval narrowed, record count by record count; the last row is where the run stopped.",
    );
    let mut pairs = vec![
        ("Order seed", q.seed.to_string()),
        ("Records compared", count(u64::from(q.records_used))),
        ("Stopped early", if q.stopped_early { "yes".into() } else { "no".into() }),
        ("Records not asked", count(q.records_not_asked.len() as u64)),
        ("Calls saved (about)", count(q.calls_saved)),
    ];
    let decided: Vec<(String, String)> =
        q.comparisons.iter().map(|c| (format!("{} vs {}", c.candidate, c.baseline), decision(c.decision))).collect();
    for (k, v) in &decided {
        pairs.push((k.as_str(), esc(v)));
    }
    s.push_str(&kv("sequential", &pairs));
    panel("sequential-panel", "Stopping when decided", &s)
}

/// An item's answers as marks, each titled with its question.
fn answers_html(
    r: &gw::RecordResult,
    q: &std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
) -> String {
    let items = q.get(&r.checklist_id);
    r.score
        .iter()
        .flat_map(|s| &s.item_scores)
        .map(|i| {
            let letter = answer_letter(i.answer);
            let question = items.and_then(|m| m.get(&i.item_id)).map_or(String::new(), |q| format!(": {q}"));
            format!(
                "<span class=\"ans {letter}\" title=\"{}\">{}</span>",
                esc(&format!("{}{question}", i.item_id)),
                mark(letter)
            )
        })
        .collect()
}

fn mark(letter: char) -> &'static str {
    match letter {
        'y' => "✓",
        'n' => "✗",
        _ => "·",
    }
}

fn responder_cell(r: &gw::RecordResult) -> String {
    if r.sample > 0 { format!("{} #{}", r.responder, r.sample + 1) } else { r.responder.clone() }
}

fn worst(
    records: &Records,
    q: &std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
) -> String {
    if records.worst.is_empty() {
        return String::new();
    }
    let by_responder = records.worst.iter().any(|r| !r.responder.is_empty());
    let rows: Vec<String> = records
        .worst
        .iter()
        .map(|r| {
            format!(
                "<tr class=\"worst\" data-record-id=\"{}\">{}{}{}{}<td class=\"answers\">{}</td></tr>",
                esc(&r.record_id),
                td_text(&r.record_id),
                if by_responder { td_text(&responder_cell(r)) } else { String::new() },
                td_num(&primary(r).map_or_else(|| "-".into(), score)),
                td_num(&r.score.as_ref().map_or_else(|| "-".into(), |s| pct(s.pass_rate))),
                answers_html(r, q),
            )
        })
        .collect();
    let head: &[&str] = if by_responder {
        &["Record", "Responder", "Primary score", "Pass rate", "Answers"]
    } else {
        &["Record", "Primary score", "Pass rate", "Answers"]
    };
    panel(
        "worst-panel",
        "Worst records",
        &format!(
            "<p class=\"muted\">The lowest primary scores over all {} results (those without a score are counted under Aggregates).</p>{}",
            count(records.total),
            table("worst", head, &rows)
        ),
    )
}

/// One record as the pager's data: `[index, id, responder, sample, primary, pass, [[item, y|n|-]],
/// checklist, error, response]`.
fn record_data(r: &gw::RecordResult) -> Value {
    let answers: Vec<Value> = r
        .score
        .iter()
        .flat_map(|s| &s.item_scores)
        .map(|i| json!([i.item_id, answer_letter(i.answer).to_string()]))
        .collect();
    json!([
        r.index,
        r.record_id,
        r.responder,
        r.sample,
        primary(r),
        r.score.as_ref().filter(|s| s.answered_count > 0).map(|s| s.pass_rate),
        answers,
        r.checklist_id,
        r.error,
        clip(&r.response, super::RESPONSE_CHARS),
    ])
}

fn record_row(
    r: &gw::RecordResult,
    by_responder: bool,
    q: &std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
) -> String {
    let p = primary(r);
    let detail = if !r.error.is_empty() {
        format!("<span class=\"error-text\">{}</span>", esc(&r.error))
    } else if !r.response.is_empty() {
        format!(
            "<details><summary>response</summary><div class=\"text\">{}</div></details>",
            esc(&clip(&r.response, super::RESPONSE_CHARS))
        )
    } else {
        String::new()
    };
    format!(
        "<tr class=\"record{}\" data-index=\"{}\" data-record-id=\"{}\">{}<td class=\"text record-id\">{}</td>{}<td class=\"num score\">{}</td>{}<td class=\"answers\">{}</td><td class=\"text detail\">{detail}</td></tr>\n",
        if p.is_none() { " failed" } else { "" },
        r.index,
        esc(&r.record_id),
        td_num(&r.index.to_string()),
        esc(&r.record_id),
        if by_responder {
            format!("<td class=\"text responder\">{}</td>", esc(&responder_cell(r)))
        } else {
            String::new()
        },
        p.map_or_else(|| "-".into(), score),
        td_num(&r.score.as_ref().filter(|s| s.answered_count > 0).map_or_else(|| "-".into(), |s| pct(s.pass_rate))),
        answers_html(r, q),
    )
}

fn records(r: &Report, q: &std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>) -> String {
    let shown = &r.records.shown;
    if shown.is_empty() {
        let why = if r.records.total == 0 {
            "No record results.".to_string()
        } else {
            format!("None of the {} results is written into this file (--records 0).", count(r.records.total))
        };
        return panel("records-panel", "Records", &format!("<p class=\"muted\">{}</p>", esc(&why)));
    }
    let by_responder = shown.iter().any(|x| !x.responder.is_empty());
    let first = &shown[..shown.len().min(PAGE)];
    let rows: Vec<String> = first.iter().map(|x| record_row(x, by_responder, q)).collect();
    let head: &[&str] = if by_responder {
        &["Index", "Record", "Responder", "Primary score", "Pass rate", "Answers", "Error or response"]
    } else {
        &["Index", "Record", "Primary score", "Pass rate", "Answers", "Error"]
    };
    let mut s = format!(
        "<p class=\"muted\" id=\"records-range\" role=\"status\" data-first=\"1\" data-last=\"{}\" data-total=\"{}\" data-page=\"0\">results 1–{} of {}</p>\n",
        first.len(),
        shown.len(),
        count(first.len() as u64),
        count(shown.len() as u64)
    );
    if shown.len() > PAGE {
        s.push_str(
            "<nav class=\"pager\" id=\"records-pager\" aria-label=\"Record pages\" hidden><button type=\"button\" id=\"records-first\">« First</button>\
             <button type=\"button\" id=\"records-prev\">← Previous</button><span id=\"records-page\"></span>\
             <button type=\"button\" id=\"records-next\">Next →</button><button type=\"button\" id=\"records-last\">Last »</button></nav>\n\
             <noscript><p class=\"muted\">The first page only: the other pages are built by this file's own script.</p></noscript>\n",
        );
    }
    s.push_str(&table("records", head, &rows));
    if r.records.total > shown.len() as u64 {
        let _ = writeln!(
            s,
            "<p class=\"notice\" id=\"records-cut\">This file holds the first {} of {} results (<code>assay report --records N</code> for more); \
             <code>assay runs results {}</code> writes them all. The aggregates, comparisons and worst records cover every result.</p>",
            count(shown.len() as u64),
            count(r.records.total),
            esc(&r.run.run_id)
        );
    }
    if shown.len() > PAGE {
        let used: std::collections::BTreeSet<&str> = shown[PAGE..].iter().map(|x| x.checklist_id.as_str()).collect();
        let questions: serde_json::Map<String, Value> = q
            .iter()
            .filter(|(id, _)| used.contains(id.as_str()))
            .map(|(id, items)| (id.clone(), json!(items)))
            .collect();
        let data = json!({
            "pageSize": PAGE,
            "shown": shown.len(),
            "responders": by_responder,
            "questions": questions,
            "rows": shown[PAGE..].iter().map(record_data).collect::<Vec<_>>(),
        });
        let _ = writeln!(s, "<script type=\"application/json\" id=\"records-data\">{}</script>", json_block(&data));
    }
    panel("records-panel", "Records", &s)
}

fn checklists(list: &[common::Checklist]) -> String {
    list.iter()
        .map(|c| {
            let items: String = c
                .items
                .iter()
                .map(|i| {
                    let category = if i.category.is_empty() { String::new() } else { format!(" <span class=\"tag\">{}</span>", esc(&i.category)) };
                    let weight = i.weight.map_or(String::new(), |w| format!(" <span class=\"tag\">weight {w}</span>"));
                    format!("<li data-item-id=\"{}\"><code>{}</code> <span class=\"text\">{}</span>{category}{weight}</li>", esc(&i.id), esc(&i.id), esc(&i.question))
                })
                .collect();
            let input = if c.input.is_empty() { String::new() } else { format!("<p><span class=\"muted\">For: </span><span class=\"text\">{}</span></p>", esc(&c.input)) };
            format!(
                "<details class=\"checklist\" data-checklist-id=\"{}\"><summary>{} · {}{}</summary>{input}<ol class=\"items\">{items}</ol></details>\n",
                esc(&c.id),
                esc(if c.id.is_empty() { "checklist" } else { &c.id }),
                esc(&plural(c.items.len(), "item")),
                if c.source_method.is_empty() { String::new() } else { format!(" · {}", esc(&c.source_method)) },
            )
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// A targeted refinement
// ---------------------------------------------------------------------------------------------

fn refinement(r: &Report, t: &gw::TargetedRefinementResult) -> String {
    let views = super::sections(t, &r.refinement, r.document.as_deref());
    let fixed = views.iter().flat_map(|v| &v.issues).filter(|(_, e)| *e == IssueEnd::Fixed).count();
    let raised = views.iter().map(|v| v.issues.len()).sum::<usize>();
    let history: Vec<String> = t.score_history.iter().map(|x| format!("{x:.3}")).collect();
    let mut s = kv(
        "refinement-summary",
        &[
            ("Outcome", format!("<strong id=\"outcome\">{}</strong>", esc(&outcome_name(t.outcome)))),
            ("Quality", esc(&quality_name(t.quality))),
            ("Final score", format!("<span id=\"final-score\">{}</span>", score(t.final_score))),
            ("Scores", esc(&history.join(" → "))),
            ("Iterations", esc(&format!("{} (returned: iteration {})", t.iterations, t.best_iteration))),
            ("Stop reason", esc(&t.stop_reason)),
            ("Warning", esc(&t.warning)),
            (
                "Sections changed",
                format!(
                    "<span id=\"sections-changed\">{}</span> of {}",
                    views.iter().filter(|v| v.changed).count(),
                    views.len()
                ),
            ),
            ("Issues fixed", format!("<span id=\"issues-fixed\">{fixed}</span> of {raised} raised")),
            ("Unresolved issues", format!("<span id=\"issues-unresolved\">{}</span>", t.unresolved_issues.len())),
            ("Tasks", esc(&format!("{} completed, {} failed", t.tasks_completed, t.tasks_failed))),
            ("Judgings", esc(&format!("{} full, {} focused", t.full_judgings, t.focused_judgings))),
            ("Locked sections", esc(&t.locked_section_ids.join(", "))),
            (
                "Note",
                if t.score_predates_fixes {
                    esc(&format!(
                        "the score was judged before the last verified fixes (sections {})",
                        t.stale_section_ids.join(", ")
                    ))
                } else if t.score_predates_self_refine {
                    "the score was judged before the self-refine hook changed sections".into()
                } else {
                    String::new()
                },
            ),
        ],
    );
    s.push_str(&format!(
        "<figure class=\"spark\">{}<figcaption class=\"muted\">The panel's score, the document as given first; the dashed line is 0.85.</figcaption></figure>\n",
        svg::score_line(&t.score_history, "score-history")
    ));
    if let Some(b) = &t.best_effort {
        let hints: String = b.improvement_hints.iter().map(|h| format!("<li>{}</li>", esc(h))).collect();
        let _ = writeln!(
            s,
            "<div class=\"banner warn\" id=\"best-effort\"><h3>Best-effort result</h3><p>Best score {} at iteration {}; {} unresolved ({}).</p>{}</div>",
            score(b.best_score),
            b.best_iteration,
            b.unresolved_issues_count,
            esc(&b.unresolved_categories.join(", ")),
            if hints.is_empty() { String::new() } else { format!("<ul>{hints}</ul>") }
        );
    }
    if !t.phase_usage.is_empty() {
        let rows: Vec<String> = t
            .phase_usage
            .iter()
            .map(|p| {
                let u = p.usage.clone().unwrap_or_default();
                format!(
                    "<tr>{}{}{}{}</tr>",
                    td_text(&p.phase),
                    td_num(&count(p.estimated_tokens)),
                    td_num(&count(tokens(&u))),
                    td_text(if p.budgeted { "yes" } else { "no (first assessment)" })
                )
            })
            .collect();
        s.push_str(&table("phases", &["Phase", "Estimated tokens", "Used tokens", "Counts against the budget"], &rows));
    }
    let mut out = panel("refinement-panel", "Refinement", &s);
    let mut doc = String::new();
    if r.document.is_none() {
        doc.push_str(
            "<p class=\"muted\">The gateway keeps the document as refined, not as given: with <code>assay report --document FILE</code> \
             (the file <code>assay refine</code> read) each changed section shows its text before. Without it, the passages the judges quoted stand for it.</p>\n",
        );
    }
    for v in &views {
        doc.push_str(&section_html(v));
    }
    out.push_str(&panel("sections-panel", "Sections before and after", &doc));
    if !t.unresolved_issues.is_empty() {
        out.push_str(&panel(
            "unresolved-panel",
            "Unresolved issues",
            &issues_table(
                "unresolved",
                &t.unresolved_issues.iter().map(|i| (i.clone(), None)).collect::<Vec<_>>(),
                true,
            ),
        ));
    }
    if !t.discarded_fixes.is_empty() {
        let rows: Vec<String> = t
            .discarded_fixes
            .iter()
            .map(|d| {
                format!(
                    "<tr>{}{}{}<td class=\"text\"><div class=\"text\">{}</div></td></tr>",
                    td_text(&d.section_id),
                    td_num(&d.iteration.to_string()),
                    td_text(&d.reason),
                    esc(&d.content)
                )
            })
            .collect();
        out.push_str(&panel(
            "discarded-panel",
            "Verified fixes not returned",
            &table("discarded", &["Section", "Iteration", "Why", "Content"], &rows),
        ));
    }
    if !t.self_refined.is_empty() {
        let inner: String = t.self_refined.iter().map(self_refined_html).collect();
        out.push_str(&panel("self-refined-panel", "Self-refine hook", &inner));
    }
    out
}

/// Issues as a table; `with_section`: a column naming each one's section.
fn issues_table(id: &str, issues: &[(common::JudgeIssue, Option<IssueEnd>)], with_section: bool) -> String {
    let with_end = issues.iter().any(|(_, e)| e.is_some());
    let rows: Vec<String> = issues
        .iter()
        .map(|(i, end)| {
            let end_cell =
                end.map_or(String::new(), |e| format!("<td class=\"end\" data-end=\"{0}\">{0}</td>", e.word()));
            format!(
                "<tr class=\"issue\" data-issue-id=\"{}\"><td class=\"tight\">{}</td><td class=\"tight\">{}</td>{}{}{}{end_cell}</tr>",
                esc(&i.id),
                esc(&severity_name(i.severity)),
                esc(&i.criterion),
                if with_section {
                    td_text(if i.section_id.is_empty() { "-" } else { &i.section_id })
                } else {
                    String::new()
                },
                td_text(&i.description),
                td_text(&i.fix_instruction),
            )
        })
        .collect();
    let mut head = vec!["Severity", "Criterion"];
    if with_section {
        head.push("Section");
    }
    head.extend(["Description", "Fix instruction"]);
    if with_end {
        head.push("Ended");
    }
    table(id, &head, &rows)
}

fn section_html(v: &SectionView) -> String {
    let mut tags = String::new();
    tags.push_str(if v.changed {
        "<span class=\"tag changed\">changed</span>"
    } else {
        "<span class=\"tag\">unchanged</span>"
    });
    if v.locked {
        tags.push_str(" <span class=\"tag locked\">locked</span>");
    }
    let scores = match (v.score_before, v.score_after) {
        (Some(b), Some(a)) => format!(" <span class=\"muted\">section score {} → {}</span>", score(b), score(a)),
        (Some(b), None) => format!(" <span class=\"muted\">section score {}</span>", score(b)),
        (None, _) => String::new(),
    };
    let mut s = format!(
        "<article class=\"doc-section{}\" data-section-id=\"{}\"><header><h3>{}</h3> <code>{}</code> {tags}{scores}</header>\n",
        if v.changed { " changed" } else { "" },
        esc(&v.id),
        esc(if v.title.is_empty() { &v.id } else { &v.title }),
        esc(&v.id),
    );
    if !v.issues.is_empty() {
        let issues: Vec<(common::JudgeIssue, Option<IssueEnd>)> =
            v.issues.iter().map(|(i, e)| (i.clone(), Some(*e))).collect();
        s.push_str(&issues_table("", &issues, false));
    }
    if !v.edits.is_empty() {
        let items: String = v
            .edits
            .iter()
            .map(|e| {
                let kept = match &e.kept {
                    Ok(()) => "<span class=\"tag good\">kept</span>".to_string(),
                    Err(why) => format!("<span class=\"tag bad\">not kept</span> {}", esc(why)),
                };
                format!(
                    "<li>iteration {}: {} {kept}{}</li>",
                    e.iteration,
                    esc(&action_name(e.action)),
                    if e.summary.is_empty() {
                        String::new()
                    } else {
                        format!(" <span class=\"muted\">{}</span>", esc(&e.summary))
                    }
                )
            })
            .collect();
        let _ = write!(s, "<ul class=\"edits\">{items}</ul>");
    }
    if v.changed {
        match &v.before {
            Some(b) => s.push_str(&before_after(b, &v.after)),
            None => {
                let quotes: String = v
                    .issues
                    .iter()
                    .filter(|(i, _)| !i.location.is_empty())
                    .map(|(i, _)| format!("<blockquote class=\"text\">{}</blockquote>", esc(&i.location)))
                    .collect();
                let before = if quotes.is_empty() {
                    "<p class=\"muted\">Not kept by the gateway.</p>".to_string()
                } else {
                    format!("<p class=\"muted\">Not kept by the gateway; the judges quoted:</p>{quotes}")
                };
                let _ = write!(
                    s,
                    "<div class=\"before-after\"><div class=\"before\"><h4>Before</h4>{before}</div>\
                     <div class=\"after\"><h4>After</h4><div class=\"text after-text\">{}</div></div></div>",
                    esc(&v.after)
                );
            }
        }
    } else {
        let _ = write!(s, "<details><summary>Text</summary><div class=\"text\">{}</div></details>", esc(&v.after));
    }
    s.push_str("</article>\n");
    s
}

/// `before` and `after` as HTML with the words that changed marked (`<del>` in the one, `<ins>` in
/// the other), each piece escaped.
fn marked_diff(before: &str, after: &str) -> (String, String) {
    let diff = similar::TextDiff::configure().timeout(std::time::Duration::from_secs(1)).diff_words(before, after);
    let (mut old, mut new) = (String::new(), String::new());
    for change in diff.iter_all_changes() {
        let piece = esc(change.value());
        match change.tag() {
            similar::ChangeTag::Equal => {
                old.push_str(&piece);
                new.push_str(&piece);
            }
            similar::ChangeTag::Delete => {
                let _ = write!(old, "<del>{piece}</del>");
            }
            similar::ChangeTag::Insert => {
                let _ = write!(new, "<ins>{piece}</ins>");
            }
        }
    }
    (old, new)
}

/// Two texts side by side, the changed words marked.
fn before_after(before: &str, after: &str) -> String {
    let (old, new) = marked_diff(before, after);
    format!(
        "<div class=\"before-after\"><div class=\"before\"><h4>Before</h4><div class=\"text before-text\">{old}</div></div>\
         <div class=\"after\"><h4>After</h4><div class=\"text after-text\">{new}</div></div></div>"
    )
}

fn self_refined_html(x: &gw::SelfRefined) -> String {
    let what = if !x.skipped.is_empty() {
        format!("skipped: {}", x.skipped)
    } else if !x.error.is_empty() {
        format!("failed: {}", x.error)
    } else if x.before == x.after {
        "unchanged".into()
    } else {
        "refined".into()
    };
    let body = if x.before != x.after { before_after(&x.before, &x.after) } else { String::new() };
    format!(
        "<details class=\"hook\" data-target=\"{}\"><summary><code>{}</code> ({}) · {}</summary>{body}</details>\n",
        esc(&x.target),
        esc(&x.target),
        esc(&x.producer),
        esc(&what)
    )
}

// ---------------------------------------------------------------------------------------------
// A debate, a self-refine
// ---------------------------------------------------------------------------------------------

fn debate(d: &gw::DebateRunResult) -> String {
    let opt_pct = |x: Option<f64>| x.map(pct).map(|p| esc(&p)).unwrap_or_default();
    let s = kv(
        "debate-summary",
        &[
            ("Problems", esc(&format!("{} ({} failed)", count(u64::from(d.problems_total)), d.problems_failed))),
            ("Correct / graded", format!("<span id=\"correct\">{}</span> / {}", d.correct, d.graded)),
            (
                "Accuracy",
                d.accuracy
                    .map(|a| format!("<span id=\"accuracy\">{}</span>", esc(&pct(a))))
                    .unwrap_or_else(|| "not graded".into()),
            ),
            ("Accuracy over all problems (failed counted wrong)", opt_pct(d.accuracy_all)),
            ("Consensus rate", esc(&pct(d.consensus_rate))),
            ("Changed rate", esc(&pct(d.changed_rate))),
            ("Tokens", esc(&format!("{} in {}", count(d.tokens), plural(d.calls as usize, "call")))),
            ("Single model accuracy", opt_pct(d.single_model_accuracy)),
            ("Self-consistency accuracy", opt_pct(d.self_consistency_accuracy)),
        ],
    );
    let yes_no = |b: Option<bool>| match b {
        Some(true) => "<td class=\"good\">correct</td>".to_string(),
        Some(false) => "<td class=\"bad\">incorrect</td>".to_string(),
        None => "<td class=\"muted\">ungraded</td>".to_string(),
    };
    let rows: Vec<String> = d
        .problems
        .iter()
        .map(|p| {
            format!(
                "<tr class=\"problem\" data-problem-id=\"{}\">{}<td class=\"text answer\">{}</td>{}{}{}{}{}</tr>",
                esc(&p.id),
                td_text(&p.id),
                esc(&p.final_answer),
                td_text(&p.reference),
                if p.error.is_empty() { yes_no(p.correct) } else { "<td class=\"bad\">failed</td>".into() },
                td_text(if p.consensus { "yes" } else { "no" }),
                td_text(&crate::cmd::render::debate::decision_name(p.decided_by)),
                td_text(&p.error),
            )
        })
        .collect();
    let mut out = panel("debate-panel", "Debate", &s);
    let mut inner = table(
        "problems",
        &["Problem", "Final answer", "Reference", "Graded", "Consensus", "Decided by", "Error"],
        &rows,
    );
    for p in &d.problems {
        inner.push_str(&problem_html(p));
    }
    out.push_str(&panel("problems-panel", "Problems", &inner));
    out
}

fn list(title: &str, items: &[String]) -> String {
    if items.is_empty() {
        return String::new();
    }
    let li: String = items.iter().map(|x| format!("<li class=\"text\">{}</li>", esc(x))).collect();
    format!("<h5>{}</h5><ul>{li}</ul>", esc(title))
}

fn problem_html(p: &gw::DebateProblemResult) -> String {
    let Some(x) = &p.debate else {
        return String::new();
    };
    let mut s = format!(
        "<details class=\"debate-problem\" data-problem-id=\"{}\"><summary>Problem <code>{}</code>: {}</summary>",
        esc(&p.id),
        esc(&p.id),
        esc(&clip(&p.final_answer, 120))
    );
    s.push_str("<h4>Answers</h4>");
    let sols: Vec<String> = x
        .solutions
        .iter()
        .map(|a| {
            format!(
                "<tr>{}<td class=\"text answer\">{}</td>{}{}</tr>",
                td_text(&a.solver_id),
                esc(&a.final_answer),
                td_num(&score(a.confidence)),
                td_text(&a.approach)
            )
        })
        .collect();
    s.push_str(&table("", &["Solver", "Answer", "Confidence", "Approach"], &sols));
    for round in &x.rounds {
        let _ = write!(s, "<h4>Round {}{}</h4>", round.round, if round.consensus { " · consensus" } else { "" });
        for v in &round.reviews {
            let errors: Vec<String> = v
                .errors
                .iter()
                .map(|e| {
                    format!(
                        "{} {}{}: {}",
                        severity_name(e.severity),
                        e.error_type,
                        if e.location.is_empty() { String::new() } else { format!(" @ {}", e.location) },
                        e.description
                    )
                })
                .collect();
            let _ = write!(
                s,
                "<div class=\"review\"><h5>{} → {}</h5>{}{}{}</div>",
                esc(&v.reviewer_id),
                esc(&v.target_solver_id),
                list("Weaknesses", &v.weaknesses),
                list("Errors", &errors),
                list("Suggested changes", &v.suggested_changes)
            );
        }
        let refined: Vec<String> = round
            .refined
            .iter()
            .map(|a| {
                format!(
                    "<tr>{}<td class=\"text answer\">{}</td>{}{}</tr>",
                    td_text(&a.solver_id),
                    esc(&a.final_answer),
                    td_num(&score(a.confidence)),
                    td_text(if a.changed { "yes" } else { "no" })
                )
            })
            .collect();
        if !refined.is_empty() {
            s.push_str(&table("", &["Solver", "Refined answer", "Confidence", "Changed"], &refined));
        }
    }
    if let Some(j) = &x.judgment {
        let _ = write!(
            s,
            "<h4>Verdict</h4>{}",
            kv(
                "",
                &[
                    ("Winner", esc(&j.winner_solver_id)),
                    ("Confidence", score(j.confidence)),
                    ("Final answer", format!("<span class=\"text answer\">{}</span>", esc(&j.final_answer))),
                    ("Reasoning", format!("<span class=\"text\">{}</span>", esc(&j.reasoning))),
                    (
                        "Majority-vote fallback",
                        if j.majority_vote_fallback {
                            esc(&format!("yes: {}", j.fallback_reason))
                        } else {
                            String::new()
                        }
                    ),
                ]
            )
        );
    } else {
        let _ = write!(
            s,
            "<h4>Verdict</h4><p>Decided by {}: {}</p>",
            esc(&crate::cmd::render::debate::decision_name(p.decided_by)),
            esc(&x.final_answer)
        );
    }
    if let Some(b) = &p.baselines {
        let graded = |c: Option<bool>| match c {
            Some(true) => " (correct)",
            Some(false) => " (incorrect)",
            None => "",
        };
        let _ = write!(
            s,
            "<h4>Baselines</h4>{}",
            kv(
                "",
                &[
                    ("Single model", esc(&format!("{}{}", b.single_model_answer, graded(b.single_model_correct)))),
                    (
                        "Self-consistency",
                        esc(&format!(
                            "{}{} · {}/{} votes",
                            b.self_consistency_answer,
                            graded(b.self_consistency_correct),
                            b.votes,
                            b.samples
                        ))
                    ),
                ]
            )
        );
    }
    s.push_str("</details>\n");
    s
}

fn self_refine(x: &rpb::SelfRefineResponse) -> String {
    let rows: Vec<String> = x
        .passes
        .iter()
        .map(|p| {
            let critique: String = p.critique.iter().map(|c| format!("<li>{}</li>", esc(c))).collect();
            let mut flags = Vec::new();
            if p.converged {
                flags.push("converged".to_string());
            }
            if p.rolled_back {
                flags.push("rolled back".to_string());
            }
            if !p.error.is_empty() {
                flags.push(format!("error: {}", p.error));
            }
            format!(
                "<tr class=\"pass\">{}<td class=\"text\"><ul>{critique}</ul></td>{}{}</tr>",
                td_num(&p.pass.to_string()),
                td_num(&format!("{:.3}", p.char_similarity)),
                td_text(&flags.join(", "))
            )
        })
        .collect();
    let mut s = kv(
        "self-refine-summary",
        &[
            ("Stop reason", esc(&crate::cmd::render::stop_reason_name(x.stop_reason))),
            ("Changed", if x.changed { "yes".into() } else { "no".into() }),
            (
                "Returned",
                esc(&if x.returned_pass == 0 {
                    "the original".to_string()
                } else {
                    format!("pass {}", x.returned_pass)
                }),
            ),
        ],
    );
    s.push_str(&table("passes", &["Pass", "Critique", "Similarity", "Flags"], &rows));
    let _ = write!(s, "<h3>Final text</h3><div class=\"text\" id=\"final-text\">{}</div>", esc(&x.final_text));
    panel("self-refine-panel", "Self-refine", &s)
}

// ---------------------------------------------------------------------------------------------
// Style and script
// ---------------------------------------------------------------------------------------------

/// The page's one stylesheet (its hash is in the Content-Security-Policy).
const CSS: &str = r#"
:root{--fg:#1d2330;--muted:#5b6474;--line:#d9dee7;--bg:#f6f7f9;--panel:#fff;--accent:#2f5fb3;--good:#1f7a3f;--bad:#b3261e;--warn:#8a5a00}
*{box-sizing:border-box}
[hidden]{display:none!important}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:var(--bg)}
header.top{padding:18px 28px 10px;background:var(--panel);border-bottom:1px solid var(--line)}
header.top h1{margin:0;font-size:20px}
.sub{margin:4px 0 0;color:var(--muted)}
main{max-width:1180px;margin:0 auto;padding:16px 20px 8px}
footer{max-width:1180px;margin:0 auto;padding:8px 20px 24px;font-size:12px}
.panel{background:var(--panel);border:1px solid var(--line);border-radius:6px;padding:14px 18px;margin:0 0 16px}
.panel h2{margin:0 0 10px;font-size:16px}
h3{font-size:14px;margin:14px 0 6px}
h4{font-size:13px;margin:10px 0 4px}
h5{font-size:12px;margin:8px 0 2px}
.muted{color:var(--muted)}
code{font:12px ui-monospace,SFMono-Regular,Menlo,monospace;background:#eef1f5;padding:1px 4px;border-radius:3px;overflow-wrap:anywhere}
.kv{display:grid;grid-template-columns:max-content 1fr;gap:3px 16px;margin:0}
.kv dt{color:var(--muted)}
.kv dd{margin:0}
.table-wrap{overflow-x:auto;margin:6px 0}
table.grid{border-collapse:collapse;width:100%;font-size:13px}
.grid th,.grid td{border-bottom:1px solid var(--line);padding:4px 8px;text-align:left;vertical-align:top}
.grid td.tight{white-space:nowrap}
del{background:#fbe3e1;color:#7d1d17;text-decoration:line-through}
ins{background:#dff3e4;color:#14532d;text-decoration:none}
.grid th{background:#f0f2f6;font-weight:600;white-space:nowrap}
.grid td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.text{white-space:pre-wrap;overflow-wrap:anywhere}
tr.failed td{background:#fdf1f0}
.error-text,.bad{color:var(--bad)}
.good{color:var(--good)}
.warn-text{color:var(--warn)}
.tag{display:inline-block;font-size:11px;padding:0 6px;border-radius:9px;background:#eef1f5;color:var(--muted);border:1px solid var(--line)}
.tag.changed{background:#e7f0ff;color:var(--accent);border-color:#bcd0f5}
.tag.locked{background:#fff4e0;color:var(--warn)}
.tag.good{background:#e6f4ea;color:var(--good)}
.tag.bad{background:#fdecea;color:var(--bad)}
.badge{font-weight:600}
.badge[data-state="succeeded"]{color:var(--good)}
.badge[data-state="failed"],.badge[data-state="cancelled"]{color:var(--bad)}
.badge[data-state="partial"]{color:var(--warn)}
.ans{display:inline-block;width:1.2em;text-align:center;font-weight:700}
.ans.y{color:var(--good)}
.ans.n{color:var(--bad)}
.ans.-{color:var(--muted)}
.pager{display:flex;gap:8px;align-items:center;margin:6px 0}
.pager button{font:inherit;padding:2px 10px}
.notice{background:#fff8e6;border:1px solid #f0dca8;padding:6px 10px;border-radius:4px}
.banner.warn{background:#fff8e6;border:1px solid #f0dca8;padding:6px 12px;border-radius:4px;margin:10px 0}
figure{margin:10px 0}
figcaption{font-size:12px}
svg.forest{width:100%;max-width:640px;height:auto;display:block}
svg.forest text{font-size:12px;fill:var(--fg)}
svg.forest text.tick{fill:var(--muted);font-size:11px}
svg.forest line.axis{stroke:#9aa3b2}
svg.forest line.zero{stroke:#9aa3b2;stroke-dasharray:4 3}
svg.forest line.interval{stroke:var(--accent);stroke-width:3}
svg.forest g.final line.interval{stroke:#163d80;stroke-width:4}
svg.forest circle.point{fill:#163d80}
svg.scores{width:320px;height:90px;display:block;background:#fafbfc;border:1px solid var(--line)}
svg.scores line.threshold{stroke:var(--good);stroke-dasharray:4 3}
svg.scores polyline.line{fill:none;stroke:var(--accent);stroke-width:2}
svg.scores circle.point{fill:#163d80}
.doc-section{border-top:1px solid var(--line);padding:10px 0}
.doc-section header h3{display:inline;margin:0 6px 0 0}
.before-after{display:grid;grid-template-columns:1fr 1fr;gap:12px;margin-top:8px}
.before,.after{background:#fafbfc;border:1px solid var(--line);border-radius:4px;padding:6px 10px}
.before{border-left:3px solid #d9a0a0}
.after{border-left:3px solid #8fc79f}
.before h4,.after h4{margin-top:2px}
blockquote{margin:4px 0;padding:2px 8px;border-left:3px solid var(--line)}
ul.edits{margin:6px 0;padding-left:20px}
details{margin:4px 0}
summary{cursor:pointer}
@media (max-width:720px){.before-after{grid-template-columns:1fr}.kv{grid-template-columns:1fr}}
@media print{.pager{display:none}body{background:#fff}.panel{border:none}}
"#;

/// The page's one script: pages the records past the first (its hash is in the
/// Content-Security-Policy). Rows are built with `textContent`: their text stays text.
const SCRIPT: &str = r#"
(function () {
  'use strict';
  var data = document.getElementById('records-data');
  var table = document.getElementById('records');
  if (!data || !table) return;
  var R = JSON.parse(data.textContent);
  var firstBody = table.tBodies[0];
  var pages = 1 + Math.ceil(R.rows.length / R.pageSize);
  var page = 0;
  var range = document.getElementById('records-range');
  var label = document.getElementById('records-page');
  var buttons = {first: 'records-first', prev: 'records-prev', next: 'records-next', last: 'records-last'};
  Object.keys(buttons).forEach(function (k) { buttons[k] = document.getElementById(buttons[k]); });
  var MARK = {y: '\u2713', n: '\u2717', '-': '\u00b7'};
  var n = function (x) { return Number(x).toLocaleString('en-US'); };
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text != null) e.textContent = String(text);
    return e;
  }
  function fmt(x, pct) {
    if (x == null) return '-';
    return pct ? (x * 100).toFixed(1) + '%' : x.toFixed(3);
  }
  function row(r) {
    var tr = el('tr', r[4] == null ? 'record failed' : 'record');
    tr.setAttribute('data-index', String(r[0]));
    tr.setAttribute('data-record-id', r[1]);
    tr.appendChild(el('td', 'num', r[0]));
    tr.appendChild(el('td', 'text record-id', r[1]));
    if (R.responders) tr.appendChild(el('td', 'text responder', r[3] > 0 ? r[2] + ' #' + (r[3] + 1) : r[2]));
    tr.appendChild(el('td', 'num score', fmt(r[4])));
    tr.appendChild(el('td', 'num', fmt(r[5], true)));
    var answers = el('td', 'answers');
    var q = R.questions[r[7]] || {};
    r[6].forEach(function (a) {
      var s = el('span', 'ans ' + a[1], MARK[a[1]] || '\u00b7');
      s.title = q[a[0]] ? a[0] + ': ' + q[a[0]] : a[0];
      answers.appendChild(s);
    });
    tr.appendChild(answers);
    var detail = el('td', 'text detail');
    if (r[8]) {
      detail.appendChild(el('span', 'error-text', r[8]));
    } else if (r[9]) {
      var d = el('details');
      d.appendChild(el('summary', null, 'response'));
      d.appendChild(el('div', 'text', r[9]));
      detail.appendChild(d);
    }
    tr.appendChild(detail);
    return tr;
  }
  function show(p) {
    page = Math.max(0, Math.min(pages - 1, p));
    var body = firstBody;
    if (page > 0) {
      body = document.createElement('tbody');
      R.rows.slice((page - 1) * R.pageSize, page * R.pageSize).forEach(function (r) { body.appendChild(row(r)); });
    }
    table.replaceChild(body, table.tBodies[0]);
    var lo = page * R.pageSize + 1;
    var hi = Math.min((page + 1) * R.pageSize, R.shown);
    range.textContent = 'results ' + n(lo) + '\u2013' + n(hi) + ' of ' + n(R.shown);
    range.setAttribute('data-first', String(lo));
    range.setAttribute('data-last', String(hi));
    range.setAttribute('data-page', String(page));
    label.textContent = 'page ' + n(page + 1) + ' of ' + n(pages);
    buttons.first.disabled = buttons.prev.disabled = page === 0;
    buttons.next.disabled = buttons.last.disabled = page === pages - 1;
  }
  buttons.first.addEventListener('click', function () { show(0); });
  buttons.prev.addEventListener('click', function () { show(page - 1); });
  buttons.next.addEventListener('click', function () { show(page + 1); });
  buttons.last.addEventListener('click', function () { show(pages - 1); });
  document.getElementById('records-pager').hidden = false;
  show(0);
})();
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_in_text_stays_text() {
        assert_eq!(
            esc(r#"<img src=x onerror="alert('1')">&"#),
            "&lt;img src=x onerror=&quot;alert(&#39;1&#39;)&quot;&gt;&amp;"
        );
        let v = json!({"id": "</script><script>alert(1)</script>&"});
        let block = json_block(&v);
        assert!(!block.contains('<') && !block.contains('>') && !block.contains('&'), "{block}");
        assert_eq!(serde_json::from_str::<Value>(&block).unwrap(), v, "the same JSON once parsed");
    }

    /// A refinement without `--document`: the section fixed shows the passage the judge quoted
    /// (escaped) for its text before, and its issue as fixed by the verified edit.
    #[test]
    fn a_refinement_without_its_document_quotes_the_judges_and_marks_the_issue_fixed() {
        use assay_proto::arbiter::v1 as arb;
        use assay_proto::delta_judge::v1 as dj;
        use gw::refinement_event::Event as E;
        let issue = common::JudgeIssue {
            id: "i1".into(),
            section_id: "s1".into(),
            criterion: "clarity".into(),
            severity: common::Severity::Major as i32,
            description: "Unclear <b>step</b>.".into(),
            location: "x < y && <script>".into(),
            ..Default::default()
        };
        let ev = |iteration, event| gw::RefinementEvent { iteration, event: Some(event) };
        let plan = arb::PlanResponse {
            consolidation: Some(arb::ConsolidateResponse { issues: vec![issue], ..Default::default() }),
            ..Default::default()
        };
        let events = vec![
            ev(1, E::RefinementStart(gw::RefinementStart { plan: Some(plan), ..Default::default() })),
            ev(
                1,
                E::PatchApplied(gw::PatchApplied {
                    section_id: "s1".into(),
                    diff_summary: "+1 line".into(),
                    ..Default::default()
                }),
            ),
            ev(
                1,
                E::VerificationResult(gw::VerificationResult {
                    section_id: "s1".into(),
                    accepted: true,
                    verification: Some(dj::VerifyResponse {
                        issues: vec![dj::IssueVerification {
                            issue_id: "i1".into(),
                            fixed: true,
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            ),
        ];
        let result = gw::TargetedRefinementResult {
            sections: vec![
                common::Section { id: "s1".into(), content: "Clear now.".into(), ..Default::default() },
                common::Section { id: "s2".into(), content: "Untouched.".into(), ..Default::default() },
            ],
            changed_section_ids: vec!["s1".into()],
            outcome: gw::RefinementOutcome::Accepted as i32,
            ..Default::default()
        };
        let views = super::super::sections(&result, &events, None);
        assert_eq!(views[0].issues.len(), 1);
        assert_eq!(views[0].issues[0].1, IssueEnd::Fixed);
        assert!(views[0].changed && !views[1].changed && views[0].edits.len() == 1);
        let report = Report {
            run: gw::Run {
                kind: gw::PipelineKind::TargetedRefinement as i32,
                result: Some(gw::RunResult {
                    result: Some(gw::run_result::Result::TargetedRefinement(result)),
                    error: String::new(),
                }),
                ..Default::default()
            },
            refinement: events,
            ..Default::default()
        };
        let page = render(&report);
        assert!(page.contains("<blockquote class=\"text\">x &lt; y &amp;&amp; &lt;script&gt;</blockquote>"), "{page}");
        assert!(page.contains("Unclear &lt;b&gt;step&lt;/b&gt;."));
        assert!(page.contains("<span id=\"issues-fixed\">1</span> of 1 raised"));
        assert_eq!(page.matches("<script").count(), 1, "the page's own script only");
    }

    #[test]
    fn the_policy_names_the_page_s_own_style_and_script() {
        let page = render(&Report::default());
        assert!(page.contains(&format!("style-src {}", csp_hash(CSS))));
        assert!(page.contains(&format!("script-src {}", csp_hash(SCRIPT))));
        assert!(
            page.contains(&format!("<style>{CSS}</style>")) && page.contains(&format!("<script>{SCRIPT}</script>"))
        );
        assert!(!page.contains("http://") && !page.contains("https://"), "nothing from the network");
    }
}
