//! Fetches the local models into `$ASSAY_MODELS_DIR` (default `~/.cache/assay/models`), or into
//! the directory given as the first argument. Same logic as `assay models fetch`.
//!
//!     cargo run -p assay-embedded --example fetch_models [DIR]

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let dir = std::env::args().nth(1).map(std::path::PathBuf::from).unwrap_or_else(assay_embedded::default_models_dir);
    match assay_embedded::fetch_models(&dir, |line: &str| eprintln!("{line}")).await {
        Ok(paths) => println!("{}", paths.dir.display()),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
