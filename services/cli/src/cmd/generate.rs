//! `assay generate`: a checklist from a preset (one per record) or from a corpus, optionally refined,
//! through the gateway's generate_checklist pipeline. Writes one checklist JSON per line.

use std::io::Write;
use std::path::{Path, PathBuf};

use assay_config::AssayConfig;
use assay_proto::common::v1 as common;
use assay_proto::gateway::v1 as gw;
use assay_proto::pipelines;
use futures::StreamExt;

use super::common::{BackendArgs, Progress, load_config, preset};
use super::error::{CliError, Ending, Outcome};
use super::follow::{NoResult, RunFollower, Step, finished_as, is_final, run_and_follow};
use super::input::{CorpusArgs, corpus_request, is_corpus, read_checklist, read_records};
use super::render::generate_checklist::{checklist_line, failure_line};
use super::render::stage_progress_line;
use super::session::Session;

/// Options of `assay generate`.
#[derive(clap::Args, Clone)]
pub struct GenerateArgs {
    /// Preset (ignored with --checklist).
    #[arg(long, default_value = "tick")]
    pub preset: String,
    /// A checklist file (JSON) to refine instead of generating one.
    #[arg(long)]
    pub checklist: Option<PathBuf>,
    /// The instruction to generate a checklist for (instance presets).
    #[arg(long, default_value = "")]
    pub input: String,
    #[arg(long, default_value = "")]
    pub reference: String,
    #[arg(long, default_value = "")]
    pub history: String,
    /// A candidate response (repeat for several; contrastive presets).
    #[arg(long)]
    pub candidate: Vec<String>,
    /// Records (JSON lines) to generate one checklist each for, instead of --input.
    #[arg(long)]
    pub data: Option<PathBuf>,
    #[command(flatten)]
    pub corpus: CorpusArgs,
    /// Instance presets: maximum items.
    #[arg(long)]
    pub max_items: Option<u32>,
    /// Output (JSON lines); standard output when absent.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Gateway address; absent = start the mesh in this process.
    #[arg(long)]
    pub gateway: Option<String>,
    #[command(flatten)]
    pub backend: BackendArgs,
}

/// `assay generate` with the configuration at `config` (`--config`): 0 every checklist, 3 some
/// generations failed, 1 the run failed or its input was refused (this verb does not tell bad input
/// apart).
pub async fn run(config: Option<&Path>, args: GenerateArgs) -> Outcome {
    let outcome = async {
        let config = load_config(config, &args.backend)?;
        let record = gw::EvalRecord {
            id: String::new(),
            input: args.input,
            target: String::new(),
            reference: args.reference,
            history: args.history,
            candidates: args
                .candidate
                .into_iter()
                .enumerate()
                .map(|(i, text)| assay_proto::generator::v1::Candidate {
                    id: i.to_string(),
                    text,
                    model: String::new(),
                })
                .collect(),
        };
        let options = GenerateOptions {
            preset: args.preset,
            record,
            checklist: args.checklist,
            data: args.data,
            corpus: args.corpus,
            max_items: args.max_items,
            out: args.out,
            gateway: args.gateway,
        };
        generate(&config, options).await
    };
    outcome.await.map_err(CliError::failed)
}

/// Everything `assay generate` takes, as the runs take it.
pub struct GenerateOptions {
    pub preset: String,
    /// Instance level: one record from flags, or many from a file.
    pub record: gw::EvalRecord,
    /// Refine this checklist instead of generating one.
    pub checklist: Option<PathBuf>,
    pub data: Option<PathBuf>,
    pub corpus: CorpusArgs,
    pub max_items: Option<u32>,
    pub out: Option<PathBuf>,
    pub gateway: Option<String>,
}

/// Generate; [`Ending::Partial`] when some generations failed.
pub async fn generate(config: &AssayConfig, args: GenerateOptions) -> Outcome {
    let preset = preset(&args.preset).map_err(CliError::Failed)?;
    let corpus = is_corpus(preset);
    let refiners = args.corpus.steps(&args.record.input).map_err(CliError::Failed)?;
    let pipelines: Vec<gw::GenerateChecklistPipeline> = if let Some(path) = &args.checklist {
        vec![gw::GenerateChecklistPipeline {
            source: Some(gw::ChecklistSource {
                source: Some(gw::checklist_source::Source::Checklist(read_checklist(path).map_err(CliError::Failed)?)),
            }),
            refiners,
            ..Default::default()
        }]
    } else if corpus {
        vec![gw::GenerateChecklistPipeline {
            source: Some(gw::ChecklistSource {
                source: Some(gw::checklist_source::Source::Corpus(
                    corpus_request(preset, &args.corpus).map_err(CliError::Failed)?,
                )),
            }),
            refiners,
            ..Default::default()
        }]
    } else {
        let records = match &args.data {
            Some(path) => read_records(path).map_err(CliError::Failed)?,
            None if args.record.input.trim().is_empty() => {
                return Err(CliError::Failed(
                    "give --input (or --data with records) for an instance-level preset".into(),
                ));
            }
            None => vec![args.record.clone()],
        };
        let candidate_models = args.corpus.candidate_specs().map_err(CliError::Failed)?;
        records
            .into_iter()
            .map(|record| gw::GenerateChecklistPipeline {
                source: Some(gw::ChecklistSource { source: Some(gw::checklist_source::Source::Preset(preset as i32)) }),
                record: Some(record),
                max_items: args.max_items,
                refiners: refiners.clone(),
                candidate_models: candidate_models.clone(),
                ..Default::default()
            })
            .collect()
    };
    let mut session = Session::open(config, args.gateway.as_deref()).await?;
    let outcome = run_all(&mut session, pipelines, &args).await;
    session.close().await?;
    outcome
}

async fn run_all(
    session: &mut Session,
    pipelines: Vec<gw::GenerateChecklistPipeline>,
    args: &GenerateOptions,
) -> Outcome {
    let mut out: Box<dyn Write> = match &args.out {
        Some(p) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(p).map_err(|e| CliError::Failed(format!("{}: {e}", p.display())))?,
        )),
        None => Box::new(std::io::stdout()),
    };
    let total = pipelines.len();
    let mut progress = Progress::new(total as u64, "checklists");
    let mut failed = 0u64;
    let mut last_error = String::new();
    // Each record is its own run; several run at once.
    let client = session.client.clone();
    let mut runs = futures::stream::iter(pipelines.into_iter().enumerate().map(|(i, p)| {
        let mut client = client.clone();
        async move {
            let request = gw::RunPipelineRequest {
                open: false,
                pipeline: Some(gw::run_pipeline_request::Pipeline::GenerateChecklist(p)),
                label: format!("assay generate #{i}"),
                budget: None,
            };
            let mut follower = Generation::default();
            let checklist = run_and_follow(&mut client, request, &mut follower).await?;
            Ok::<_, CliError>((i, follower, checklist))
        }
    }))
    .buffered(4);
    while let Some(r) = runs.next().await {
        let (i, generation, checklist) = r?;
        for n in &generation.notes {
            progress.note(n);
        }
        let line = match checklist {
            Ok(c) => checklist_line(&generation.run_id, i, &c),
            Err(error) => {
                failed += 1;
                last_error.clone_from(&error);
                failure_line(&generation.run_id, i, &error)
            }
        };
        writeln!(out, "{line}")?;
        progress.inc(failed);
    }
    out.flush()?;
    progress.finish();
    if total == 1 && failed == 1 {
        return Err(CliError::Failed(format!("generation failed: {last_error}")));
    }
    Ok(if failed == 0 { Ending::Done } else { Ending::Partial })
}

/// Follows one generation run ([`run_and_follow`]): keeps its progress notes for the caller (runs
/// go on at once; their notes are printed in order) and ends with the checklist or why there is
/// none.
#[derive(Default)]
struct Generation {
    run_id: String,
    notes: Vec<String>,
}

impl RunFollower for Generation {
    type Ending = Result<common::Checklist, String>;
    fn on_event(&mut self, ev: gw::RunEvent) -> Step<Result<Self::Ending, CliError>> {
        use gw::run_event::Event;
        self.run_id.clone_from(&ev.run_id);
        match ev.event {
            Some(Event::Progress(p)) => {
                if let Some(p) = p.progress {
                    self.notes.push(stage_progress_line(&p));
                }
            }
            Some(Event::Completed(c)) => return Step::Done(Ok(self.completed(c.state, c.result))),
            Some(_) | None => {}
        }
        Step::Continue
    }

    fn on_stream_end(&mut self, run: gw::Run) -> Option<Result<Self::Ending, CliError>> {
        is_final(run.state).then(|| Ok(self.completed(run.state, run.result)))
    }
}

impl Generation {
    /// The run's checklist, or the error its line carries (the run's own reason when it gave one).
    fn completed(&self, state: i32, result: Option<gw::RunResult>) -> Result<common::Checklist, String> {
        match finished_as::<pipelines::GenerateChecklist>(state, result, "checklist") {
            Ok(c) => Ok(c),
            Err(NoResult::Failed(why)) if !why.is_empty() => Err(why),
            Err(e) => Err(e.message(&self.run_id)),
        }
    }
}
