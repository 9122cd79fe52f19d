//! The Kubernetes manifests (`deploy/k8s`, one replica on the embedded
//! store, and the overlay `deploy/k8s-ha`, three replicas on PostgreSQL)
//! validate strictly against the Kubernetes API schemas
//! (`kubernetes-validate --strict`: unknown fields are errors). Skipped
//! with a notice where `kubernetes-validate` is not installed; `.ci/run`
//! installs it.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

/// Every resource file of `dir` (the kustomization itself is not one).
fn manifests(dir: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("manifest directory")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .filter(|p| p.file_name().is_some_and(|n| n != "kustomization.yaml"))
        .collect();
    files.sort();
    files
}

fn validate(files: &[PathBuf]) -> (bool, String) {
    let out = Command::new("kubernetes-validate")
        .arg("--strict")
        .args(files)
        .output()
        .expect("kubernetes-validate runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn the_manifests_validate_against_the_kubernetes_schemas() {
    if !common::external("kubernetes-validate") {
        return;
    }
    for dir in ["deploy/k8s", "deploy/k8s-ha"] {
        let files = manifests(dir);
        assert!(files.len() >= 5, "{dir}: {files:?}");
        let (ok, text) = validate(&files);
        assert!(ok, "{dir}:\n{text}");
        let passed = text.matches(" passed for resource ").count();
        assert!(
            passed >= files.len(),
            "{dir}: every file's resources were checked:\n{text}"
        );
    }
}

/// The check can fail: a Deployment with a field the API does not have is
/// refused under `--strict`.
#[test]
fn a_manifest_with_an_unknown_field_is_refused() {
    if !common::external("kubernetes-validate") {
        return;
    }
    let dir = common::relay::scratch_dir("manifests");
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.yaml");
    let good = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/k8s-ha/deployment.yaml"),
    )
    .unwrap();
    std::fs::write(&bad, good.replacen("spec:\n", "spec:\n  replicaz: 3\n", 1)).unwrap();
    let (ok, text) = validate(&[bad]);
    assert!(!ok, "an unknown field passed:\n{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
