//! A throwaway PostgreSQL cluster for tests: `initdb` into a fresh directory
//! owned by the `postgres` OS user, started with `pg_ctl` on a free loopback
//! port (never a system service), stopped and removed on drop. Root runs the
//! tools through `runuser -u postgres --`; the `postgres` user runs them
//! directly; anyone else skips. Connections over TCP need the password
//! [`Postgres::password_file`] holds (scram-sha-256), as a deployment's do.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};

/// The superuser's password in every throwaway cluster.
const PASSWORD: &str = "throwaway-test-password";

/// A running throwaway cluster.
pub struct Postgres {
    bin: PathBuf,
    root: PathBuf,
    port: u16,
    as_root: bool,
}

/// The directory of PostgreSQL's server programs: the newest
/// `/usr/lib/postgresql/<version>/bin` (Debian), else wherever `pg_ctl` is on
/// `PATH`.
fn server_bin() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("pg_ctl").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Some(bin);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).find(|dir| dir.join("pg_ctl").exists())
}

/// The uid and gid of the `postgres` user.
fn postgres_ids() -> Option<(u32, u32)> {
    let id = |flag: &str| -> Option<u32> {
        let out = Command::new("id").args([flag, "postgres"]).output().ok()?;
        String::from_utf8(out.stdout).ok()?.trim().parse().ok()
    };
    Some((id("-u")?, id("-g")?))
}

fn my_uid() -> Option<u32> {
    let out = Command::new("id").arg("-u").output().ok()?;
    String::from_utf8(out.stdout).ok()?.trim().parse().ok()
}

/// Prints why the test is skipped and returns `None`; fails instead under
/// `AHP_RELAY_REQUIRE_EXTERNAL=1`.
fn skip<T>(why: &str) -> Option<T> {
    assert!(
        std::env::var("AHP_RELAY_REQUIRE_EXTERNAL").as_deref() != Ok("1"),
        "{why}, and AHP_RELAY_REQUIRE_EXTERNAL=1"
    );
    eprintln!("SKIPPED: {why}");
    None
}

impl Postgres {
    /// Starts a cluster, or prints `SKIPPED: …` and returns `None` where
    /// PostgreSQL is missing or cannot run as `postgres` (failing instead
    /// under `AHP_RELAY_REQUIRE_EXTERNAL=1`, which `.ci/run` sets).
    pub fn start(tag: &str) -> Option<Self> {
        let bin = server_bin();
        let pg_ctl = bin
            .as_ref()
            .map_or("pg_ctl".into(), |b| b.join("pg_ctl").display().to_string());
        if !super::external(&pg_ctl) {
            return None;
        }
        let bin = bin?;
        let Some((uid, gid)) = postgres_ids() else {
            return skip("there is no `postgres` OS user to run the cluster as");
        };
        let me = my_uid()?;
        if me != 0 && me != uid {
            return skip("PostgreSQL tests run as root (through runuser) or as `postgres`");
        }
        static NEXT: AtomicU64 = AtomicU64::new(0);
        // Under /tmp rather than $TMPDIR: `postgres` must reach it, and the
        // socket path in it must stay under the kernel's 107 bytes.
        let tmp = Path::new("/tmp");
        let base = if tmp.is_dir() {
            tmp.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let root = base.join(format!(
            "ahp-pg-{tag}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&root).expect("cluster directory");
        std::os::unix::fs::chown(&root, Some(uid), Some(gid)).expect("chown to postgres");
        let pg = Postgres {
            bin,
            root,
            port: super::reserved_port(),
            as_root: me == 0,
        };
        std::fs::write(pg.password_file(), format!("{PASSWORD}\n")).expect("password file");
        let pwfile = pg.root.join("initdb.pw");
        std::fs::write(&pwfile, PASSWORD).expect("initdb password");
        std::os::unix::fs::chown(&pwfile, Some(uid), Some(gid)).expect("chown");
        pg.tool(
            "initdb",
            &[
                "-D",
                &pg.data().display().to_string(),
                "-U",
                "postgres",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                &format!("--pwfile={}", pwfile.display()),
                "--no-sync",
            ],
        );
        pg.start_server();
        Some(pg)
    }

    /// The data directory.
    fn data(&self) -> PathBuf {
        self.root.join("data")
    }

    /// A file with the superuser's password (for `store_password_file`).
    pub fn password_file(&self) -> PathBuf {
        self.root.join("password")
    }

    /// The port it listens on (127.0.0.1 only).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:PORT/DB`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Creates the database `name` and returns its URL.
    pub fn create_db(&self, name: &str) -> String {
        self.tool(
            "createdb",
            &[
                "-h",
                &self.root.display().to_string(),
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                name,
            ],
        );
        self.url(name)
    }

    /// Starts the server (again), waiting until it accepts connections.
    pub fn start_server(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c shared_buffers=16MB \
             -c max_connections=40",
            self.port,
            self.root.display()
        );
        self.tool(
            "pg_ctl",
            &[
                "-D",
                &self.data().display().to_string(),
                "-l",
                &self.root.join("log").display().to_string(),
                "-w",
                "-o",
                &options,
                "start",
            ],
        );
    }

    /// Stops the server at once (`immediate`: connections are cut as when
    /// its machine goes away).
    pub fn stop_server(&self) {
        self.tool(
            "pg_ctl",
            &[
                "-D",
                &self.data().display().to_string(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        );
    }

    /// Freezes (`SIGSTOP`) or thaws (`SIGCONT`) the server and its backends:
    /// a database that stops answering without closing anything, as behind
    /// a dropped network path.
    pub fn freeze(&self, frozen: bool) {
        let pid_file =
            std::fs::read_to_string(self.data().join("postmaster.pid")).expect("postmaster.pid");
        let main: u32 = pid_file
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .expect("postmaster pid");
        let mut pids = vec![main];
        for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            // `pid (comm) state ppid …`; comm may hold spaces, not ')'.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if ppid == Some(main) {
                pids.push(pid);
            }
        }
        let signal = if frozen { "-STOP" } else { "-CONT" };
        let status = Command::new("kill")
            .arg(signal)
            .args(pids.iter().map(u32::to_string))
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {signal} {pids:?}");
    }

    /// Turns TLS on with `cert` and `key` (PEM) and restarts the server:
    /// clients that ask for TLS (`sslmode=require`) get it.
    pub fn enable_tls(&self, cert: &Path, key: &Path) {
        let (uid, gid) = postgres_ids().expect("postgres user");
        for (from, name) in [(cert, "server.crt"), (key, "server.key")] {
            let to = self.data().join(name);
            std::fs::copy(from, &to).expect("copy TLS file");
            std::os::unix::fs::chown(&to, Some(uid), Some(gid)).expect("chown");
            std::fs::set_permissions(&to, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .expect("chmod");
        }
        let conf = self.data().join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).expect("postgresql.conf");
        text.push_str("\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n");
        std::fs::write(&conf, text).expect("postgresql.conf");
        self.stop_server();
        self.start_server();
    }

    /// Runs one of the server's programs as `postgres`; panics with its
    /// output on failure.
    fn tool(&self, name: &str, args: &[&str]) -> Output {
        let program = self.bin.join(name);
        let mut cmd = if self.as_root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&program);
            c
        } else {
            Command::new(&program)
        };
        let out = cmd
            .args(args)
            .current_dir(&self.root)
            .env_remove("PGPASSWORD")
            .output()
            .unwrap_or_else(|e| panic!("{name} runs: {e}"));
        assert!(
            out.status.success(),
            "{name} {args:?} failed: {}{}\nserver log:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(self.root.join("log")).unwrap_or_default()
        );
        out
    }

    /// The cluster's directory (data, socket, log).
    pub fn root(&self) -> &Path {
        &self.root
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let program = self.bin.join("pg_ctl");
        let data = self.data().display().to_string();
        let args = ["-D", data.as_str(), "-m", "immediate", "-w", "stop"];
        let _ = if self.as_root {
            Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(&program)
                .args(args)
                .current_dir(&self.root)
                .output()
        } else {
            Command::new(&program).args(args).output()
        };
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
