//! Generates Rust code for every Assay contract under `proto/` with a vendored protoc.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-env-changed=PROTOC");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let root = root.canonicalize()?;
    println!("cargo:rerun-if-changed={}", root.display());
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY-free: build scripts are single threaded; tonic-prost-build reads PROTOC.
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let files: Vec<PathBuf> =
        ["common", "generator", "refiners", "scorer", "arbiter", "delta_judge", "debate", "gateway"]
            .iter()
            .map(|p| root.join(format!("assay/{p}/v1/{p}.proto")))
            .collect();
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc);
    tonic_prost_build::configure().file_descriptor_set_path(out.join("assay_descriptor.bin")).compile_with_config(
        config,
        &files,
        &[root],
    )?;
    Ok(())
}
