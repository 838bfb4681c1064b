//! `assay serve STAGE`: one service of the mesh on its own, as one Kubernetes Deployment runs it.

use std::process::ExitCode;

/// Options of `assay serve`.
#[derive(clap::Args, Clone)]
pub struct ServeArgs {
    /// The service to run.
    #[arg(value_parser = stage_parser())]
    pub stage: assay_mesh::Stage,
}

/// `assay serve`: the stage's own process, with its own exit codes (0 stopped after a drain, 1 it
/// could not start or serve, 2 bad configuration), decided by `assay_mesh::standalone`.
pub async fn run(args: ServeArgs) -> ExitCode {
    assay_mesh::standalone::run(args.stage).await
}

/// The names `assay serve` takes, one per row of the stage table, each with the gRPC service it
/// serves (in `--help`, and in the error for an unknown name).
fn stage_parser() -> impl clap::builder::TypedValueParser<Value = assay_mesh::Stage> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser as _};
    let names = assay_mesh::STAGES.iter().map(|d| PossibleValue::new(d.stage.name()).help(d.service_name));
    PossibleValuesParser::new(names)
        .try_map(|name: String| assay_mesh::Stage::from_name(&name).ok_or_else(|| format!("no stage {name}")))
}
