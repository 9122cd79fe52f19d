//! `ahp-relay cert`: a CA and a server certificate for testing a relay
//! with `serve` ([`crate::devkit::test_pki`]), written to a directory with
//! the lines to put in the config and the CA to give clients.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

/// Flags of `cert`.
#[derive(Debug, Clone, Args)]
pub struct CertArgs {
    /// A DNS name or IP address the server certificate is valid for (repeatable).
    #[arg(long = "host", value_name = "NAME", required = true)]
    pub hosts: Vec<String>,
    /// Directory to write `ca.pem`, `ca-key.pem`, `server.pem` and
    /// `server-key.pem` to (created; existing files are never overwritten).
    #[arg(long, default_value = ".")]
    pub out: PathBuf,
}

/// Writes the four files and prints how to use them.
pub fn run(args: CertArgs) -> ExitCode {
    match write(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Why `cert` failed.
#[derive(Debug, thiserror::Error)]
enum CertError {
    /// Generation failed (e.g. a name that is neither DNS nor IP).
    #[error("certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// A file could not be written (it exists, or the directory is not writable).
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

fn write(args: &CertArgs) -> Result<(), CertError> {
    let pki = crate::devkit::test_pki(&args.hosts)?;
    let path = |name: &str| args.out.join(name);
    let failed = |p: PathBuf| move |source| CertError::Write { path: p, source };
    std::fs::create_dir_all(&args.out).map_err(failed(args.out.clone()))?;
    let files = [
        ("ca.pem", pki.ca_cert.as_str(), false),
        ("ca-key.pem", pki.ca_key.as_str(), true),
        ("server.pem", pki.server_cert.as_str(), false),
        ("server-key.pem", pki.server_key.as_str(), true),
    ];
    // Check first, so a refusal leaves no half-written set behind.
    if let Some((name, ..)) = files.iter().find(|(name, ..)| path(name).exists()) {
        let exists = std::io::Error::from(std::io::ErrorKind::AlreadyExists);
        return Err(failed(path(name))(exists));
    }
    for (name, pem, private) in files {
        let p = path(name);
        let written = if private {
            crate::run::write_private(&p, pem.as_bytes())
        } else {
            std::fs::write(&p, pem)
        };
        written.map_err(failed(p))?;
    }
    let shown = |name: &str| path(name).display().to_string();
    println!(
        "CA (give it to clients: --ca or AHP_RELAY_CA): {}",
        shown("ca.pem")
    );
    println!("In the relay's config:");
    println!("[listen]");
    println!("tls_cert = \"{}\"", shown("server.pem"));
    println!("tls_key = \"{}\"", shown("server-key.pem"));
    Ok(())
}
