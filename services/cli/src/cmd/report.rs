//! `assay report RUN`: a finished run as one file to share, read through the gateway: GetRun, a
//! checklist evaluation's results a page at a time (ListRunResults), and the events a report
//! draws from (a refinement's, and the comparisons of a run that stopped when decided). Written
//! as a self-contained HTML page (default `report-<run>.html`) or as Markdown for a pull-request
//! comment (default standard output); the forms are [`render::report`](super::render::report).

use std::path::{Path, PathBuf};

use assay_config::AssayConfig;
use assay_proto::gateway::v1 as gw;

use super::common::{BackendArgs, load_config};
use super::error::{CliError, Ending, Outcome, status_text};
use super::render::report::{self, Report};
use super::render::{kind_name, state_name};
use super::session::{Client, client};
use super::source::{each_result, gateway_url};

/// The forms of a report.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// One self-contained HTML page: inline CSS and SVG charts, nothing from the network.
    Html,
    /// Markdown for a pull-request comment: the summary, the comparisons, the worst records.
    Md,
}

/// Options of `assay report`.
#[derive(clap::Args, Clone, Debug)]
pub struct ReportArgs {
    /// The run (its id on the gateway). It must have finished: succeeded, partial, failed or
    /// cancelled.
    pub run: String,
    /// Where to write: a file, or `-` for standard output. Default: `report-<run>.html` for
    /// html, standard output for md.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The form of the report.
    #[arg(long, value_enum, default_value_t = Format::Html)]
    pub format: Format,
    /// Gateway address (default: the configured gateway port on this machine).
    #[arg(long)]
    pub gateway: Option<String>,
    /// A checklist evaluation's results written into the page, the first in record order (the
    /// aggregates, comparisons and worst records cover them all); past the first 1,000 the page
    /// pages them with its own script.
    #[arg(long, default_value_t = 20_000, value_name = "N")]
    pub records: usize,
    /// A refinement's document as given (the JSON file `assay refine` read): the gateway keeps the
    /// refined document only, so this is where the changed sections' text before comes from.
    #[arg(long, value_name = "FILE")]
    pub document: Option<PathBuf>,
}

/// `assay report`: 0 written; 2 an unknown or unfinished run, an unreachable gateway, a bad
/// `--document`; 1 the report could not be written.
pub async fn run(config: Option<&Path>, args: ReportArgs) -> Outcome {
    let config = load_config(config, &BackendArgs::default())?;
    let url = gateway_url(&config, args.gateway.as_deref());
    let document = match &args.document {
        Some(p) => {
            Some(super::refine::read_doc(p).map_err(|e| CliError::BadInput(format!("--document: {e}")))?.sections)
        }
        None => None,
    };
    let mut r = gather(&config, &url, &args.run, args.records).await?;
    r.document = document;
    let text = match args.format {
        Format::Html => report::html::render(&r),
        Format::Md => report::markdown::render(&r),
    };
    let out = match (&args.out, args.format) {
        (Some(p), _) if p.as_os_str() == "-" => None,
        (Some(p), _) => Some(p.clone()),
        (None, Format::Html) => Some(PathBuf::from(format!("report-{}.html", file_safe(&args.run)))),
        (None, Format::Md) => None,
    };
    match out {
        Some(path) => {
            std::fs::write(&path, text).map_err(|e| CliError::Failed(format!("{}: {e}", path.display())))?;
            eprintln!("report of run {} written to {}", args.run, path.display());
        }
        None => out!("{text}"),
    }
    Ok(Ending::Done)
}

/// A run id as part of a file name: characters other than letters, digits, `-` and `_` become `_`.
fn file_safe(run_id: &str) -> String {
    run_id.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect()
}

/// Read what a report of `run_id` shows from the gateway at `url`, keeping at most `keep` record
/// results.
pub async fn gather(config: &AssayConfig, url: &str, run_id: &str, keep: usize) -> Result<Report, CliError> {
    if run_id.trim().is_empty() {
        return Err(CliError::BadInput("RUN must not be empty".into()));
    }
    let mut c = client(config, url)?;
    let run = c
        .get_run(gw::GetRunRequest { run_id: run_id.to_string() })
        .await
        .map_err(|s| {
            let code = s.code();
            if code == tonic::Code::NotFound {
                CliError::BadInput(format!("unknown run id {run_id:?} on the gateway at {url}"))
            } else if code == tonic::Code::Unavailable || code == tonic::Code::Unknown {
                CliError::BadInput(format!("the gateway at {url} is unreachable: {}", status_text(&s)))
            } else {
                CliError::Failed(format!("run {run_id}: {}", status_text(&s)))
            }
        })?
        .into_inner()
        .run
        .unwrap_or_default();
    if !super::follow::is_final(run.state) {
        return Err(CliError::BadInput(format!(
            "run {run_id} is {}: a report is of a finished run (succeeded, partial, failed or cancelled)",
            state_name(run.state)
        )));
    }
    let mut r = Report { run, ..Default::default() };
    let kind = gw::PipelineKind::try_from(r.run.kind).unwrap_or(gw::PipelineKind::Unspecified);
    match kind {
        gw::PipelineKind::ChecklistEval => {
            // The results a page at a time (an open run's are only there); the run's copy is
            // dropped so a large inline run is not held twice.
            if let Some(gw::run_result::Result::ChecklistEval(e)) =
                r.run.result.as_mut().and_then(|x| x.result.as_mut())
            {
                e.results = Vec::new();
            }
            let records = &mut r.records;
            each_result(&mut c, run_id, |x| {
                records.push(x, keep);
                Ok(())
            })
            .await
            .map_err(CliError::Failed)?;
            let sequential = report::evaluation(&r.run).is_some_and(|e| e.sequential.is_some());
            if sequential {
                r.updates = events(&mut c, run_id, |e| {
                    if let gw::run_event::Event::ComparisonUpdated(u) = e { Some(u) } else { None }
                })
                .await?;
            }
        }
        gw::PipelineKind::TargetedRefinement => {
            r.refinement =
                events(&mut c, run_id, |e| if let gw::run_event::Event::Refinement(x) = e { Some(x) } else { None })
                    .await?;
        }
        gw::PipelineKind::Debate
        | gw::PipelineKind::SelfRefine
        | gw::PipelineKind::GenerateChecklist
        | gw::PipelineKind::Unspecified => {}
    }
    tracing::debug!(run = run_id, kind = %kind_name(r.run.kind), records = r.records.total, "report read");
    Ok(r)
}

/// The run's events that `pick` keeps, replayed from the first (a finished run's stream ends after
/// the replay).
async fn events<T>(
    c: &mut Client,
    run_id: &str,
    pick: impl Fn(gw::run_event::Event) -> Option<T>,
) -> Result<Vec<T>, CliError> {
    let mut stream = c
        .watch_run(gw::WatchRunRequest { run_id: run_id.to_string(), after_sequence: 0 })
        .await
        .map_err(|s| CliError::Failed(format!("reading the events of run {run_id}: {}", status_text(&s))))?
        .into_inner();
    let mut out = Vec::new();
    while let Some(m) = stream
        .message()
        .await
        .map_err(|s| CliError::Failed(format!("reading the events of run {run_id}: {}", status_text(&s))))?
    {
        out.extend(m.event.and_then(|e| e.event).and_then(&pick));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_make_safe_file_names() {
        assert_eq!(file_safe("01JAB-c_d"), "01JAB-c_d");
        assert_eq!(file_safe("../etc/x y"), "___etc_x_y");
    }
}
