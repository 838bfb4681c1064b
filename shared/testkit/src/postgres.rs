//! A throwaway PostgreSQL server for tests: a new cluster (`initdb`) in a temp dir, started with
//! `pg_ctl` on a free loopback port, user `assay` trusted on loopback only, removed on drop. Uses
//! the server binaries of the Debian `postgresql` package (`scripts/setup-deps.sh` installs it).
//! As root, the server runs as the `postgres` user (PostgreSQL refuses to run as root).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Why a server could not be started or used.
#[derive(Debug, thiserror::Error)]
pub enum PostgresError {
    #[error("no PostgreSQL server binaries (install the Debian package `postgresql`)")]
    NotInstalled,
    #[error("no free port: {0}")]
    NoFreePort(#[source] std::io::Error),
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("chown {user} {} failed", path.display())]
    Chown { user: String, path: PathBuf },
    /// A server tool (`initdb`, `pg_ctl`, `psql`) failed: what it printed.
    #[error("{tool} failed: {output}")]
    Tool { tool: String, output: String },
    #[error("PostgreSQL did not start: {last}\n{log}")]
    NotStarted { last: Box<PostgresError>, log: String },
}

/// A running PostgreSQL server, stopped and deleted on drop.
pub struct TempPostgres {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
    run_as: Option<String>,
}

/// Where the server binaries are: `pg_config --bindir`, else the newest `/usr/lib/postgresql/*/bin`.
fn bindir() -> Option<PathBuf> {
    let from_pg_config = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .filter(|d| d.join("postgres").exists());
    from_pg_config.or_else(|| {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .filter(|d| d.join("postgres").exists())
            .collect();
        dirs.sort();
        dirs.pop()
    })
}

fn free_port() -> Result<u16, PostgresError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(PostgresError::NoFreePort)?;
    Ok(l.local_addr().map_err(PostgresError::NoFreePort)?.port())
}

/// An I/O error about `path`.
fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PostgresError + '_ {
    move |source| PostgresError::Io { path: path.to_path_buf(), source }
}

impl TempPostgres {
    /// Start a server; an error says why it cannot (no PostgreSQL installed, initdb failed, ...).
    pub fn start() -> Result<TempPostgres, PostgresError> {
        Self::start_inner(None)
    }

    /// Start a server that offers TLS with this certificate and key (PEM), besides plaintext.
    pub fn start_with_tls(cert_pem: &str, key_pem: &str) -> Result<TempPostgres, PostgresError> {
        Self::start_inner(Some((cert_pem, key_pem)))
    }

    fn start_inner(tls: Option<(&str, &str)>) -> Result<TempPostgres, PostgresError> {
        static N: AtomicU32 = AtomicU32::new(0);
        let bin = bindir().ok_or(PostgresError::NotInstalled)?;
        let is_root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        let run_as = is_root.then(|| "postgres".to_string());
        let dir = std::env::temp_dir().join(format!(
            "assay-pg-{}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos())
        ));
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let mut pg = TempPostgres { dir, bin, port: 0, run_as };
        if let Some(user) = &pg.run_as {
            let chown = Command::new("chown").arg(user).arg(&pg.dir).status().map_err(io(Path::new("chown")))?;
            if !chown.success() {
                return Err(PostgresError::Chown { user: user.clone(), path: pg.dir.clone() });
            }
        }
        let data = pg.dir.join("data");
        pg.run("initdb", &["-D", path(&data), "-U", "assay", "-A", "trust", "-E", "UTF8", "--no-sync"])?;
        let mut ssl = String::new();
        if let Some((cert, key)) = tls {
            // The server reads them as its own user; the key must not be readable by others.
            let (cert_file, key_file) = (pg.dir.join("server.crt"), pg.dir.join("server.key"));
            for (file, pem) in [(&cert_file, cert), (&key_file, key)] {
                std::fs::write(file, pem).map_err(io(file))?;
                std::fs::set_permissions(file, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                    .map_err(io(file))?;
                if let Some(user) = &pg.run_as {
                    Command::new("chown").arg(user).arg(file).status().map_err(io(Path::new("chown")))?;
                }
            }
            ssl = format!(" -c ssl=on -c ssl_cert_file={} -c ssl_key_file={}", path(&cert_file), path(&key_file));
        }
        let mut last = None;
        for _ in 0..3 {
            pg.port = free_port()?;
            let opts = format!(
                "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off{ssl}",
                pg.port,
                path(&pg.dir)
            );
            let log = pg.dir.join("server.log");
            match pg.run("pg_ctl", &["-D", path(&data), "-l", path(&log), "-o", &opts, "-w", "-t", "60", "start"]) {
                Ok(()) => return Ok(pg),
                Err(e) => last = Some((e, std::fs::read_to_string(&log).unwrap_or_default())),
            }
        }
        let (last, log) = last.unwrap_or((PostgresError::NotInstalled, String::new()));
        Err(PostgresError::NotStarted { last: Box::new(last), log })
    }

    fn run(&self, tool: &str, args: &[&str]) -> Result<(), PostgresError> {
        let exe = self.bin.join(tool);
        let mut cmd = match &self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        let out = cmd.args(args).current_dir(&self.dir).output().map_err(io(&exe))?;
        if out.status.success() {
            Ok(())
        } else {
            let output = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            Err(PostgresError::Tool { tool: tool.to_string(), output })
        }
    }

    /// The connection URL of database `postgres` as user `assay`.
    pub fn url(&self) -> String {
        format!("postgres://assay@127.0.0.1:{}/postgres", self.port)
    }

    /// A new empty database on this server, and its URL.
    pub fn database(&self, name: &str) -> Result<String, PostgresError> {
        let psql = self.bin.join("psql");
        let out = Command::new(&psql)
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "assay", "-d", "postgres", "-c"])
            .arg(format!("CREATE DATABASE \"{name}\""))
            .output()
            .map_err(io(&psql))?;
        if !out.status.success() {
            return Err(PostgresError::Tool {
                tool: "psql".into(),
                output: String::from_utf8_lossy(&out.stderr).into(),
            });
        }
        Ok(format!("postgres://assay@127.0.0.1:{}/{name}", self.port))
    }

    /// Run `sql` on database `postgres` (psql, unaligned, tuples only): its output, trimmed.
    pub fn query(&self, sql: &str) -> Result<String, PostgresError> {
        let psql = self.bin.join("psql");
        let out = Command::new(&psql)
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "assay", "-d", "postgres", "-tA", "-c"])
            .arg(sql)
            .output()
            .map_err(io(&psql))?;
        if !out.status.success() {
            return Err(PostgresError::Tool {
                tool: "psql".into(),
                output: String::from_utf8_lossy(&out.stderr).into(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Start a server, or: panic when `ASSAY_REQUIRE_POSTGRES=1` (CI), else print why the test is
    /// skipped and return `None`.
    pub fn start_or_skip(test: &str) -> Option<TempPostgres> {
        match TempPostgres::start() {
            Ok(pg) => Some(pg),
            Err(e) if std::env::var("ASSAY_REQUIRE_POSTGRES").as_deref() == Ok("1") => {
                panic!("{test}: PostgreSQL is required (ASSAY_REQUIRE_POSTGRES=1): {e}")
            }
            Err(e) => {
                eprintln!("SKIPPED {test}: {e}");
                None
            }
        }
    }
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap_or_default()
}

impl Drop for TempPostgres {
    fn drop(&mut self) {
        let data = self.dir.join("data");
        let _ = self.run("pg_ctl", &["-D", path(&data), "-m", "immediate", "-w", "stop"]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
