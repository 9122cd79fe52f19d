//! The shipped example configurations load and validate (contract §8.1),
//! and policy mistakes are reported with file and line (§7, `check-config`).

use std::path::Path;

use ahp_relay::config::{ConfigError, RelayConfig};

fn load(name: &str) -> RelayConfig {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("config")
        .join(name);
    let cfg = RelayConfig::load(&path)
        .unwrap_or_else(|e| panic!("{} does not load: {e}", path.display()));
    cfg.auth
        .validate()
        .unwrap_or_else(|e| panic!("{}: [auth] does not validate: {e}", path.display()));
    assert!(!cfg.auth.issuers.is_empty(), "{name} names an issuer");
    cfg
}

/// `config/relay.example.toml` parses with `RelayConfig::load` and passes validation.
#[test]
fn example_config_loads_and_validates() {
    let cfg = load("relay.example.toml");
    assert!(!cfg.policy.rules.is_empty(), "the example has a policy");
    assert!(
        cfg.policy.audit_max_value_bytes.is_some(),
        "the example shows [policy] audit_max_value_bytes"
    );
    use ahp_relay::config::AuthenticateScope;
    let scope = |id: &str| cfg.host(id).map(|h| h.authenticate);
    assert_eq!(
        scope("devbox"),
        Some(AuthenticateScope::HostWide),
        "the VS Code host"
    );
    assert_eq!(
        scope("gpu1"),
        Some(AuthenticateScope::PerConnection),
        "the default"
    );
}

/// The example's commented PostgreSQL store lines, uncommented in place of
/// its redb `store`, load: a store URL, its password file and CA file.
#[test]
fn example_postgres_store_lines_load() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let text = std::fs::read_to_string(dir.join("relay.example.toml")).expect("example");
    let redb = "store = \"/var/lib/ahp-relay/uris.redb\"\n";
    assert!(text.contains(redb), "the example keeps redb as the default");
    let pg: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# "))
        .filter(|l| l.starts_with("store = ") || l.starts_with("store_"))
        .collect();
    assert_eq!(pg.len(), 3, "{pg:?}");
    let edited = text.replace(redb, &(pg.join("\n") + "\n"));
    let path =
        std::env::temp_dir().join(format!("ahp-relay-pg-example-{}.toml", std::process::id()));
    std::fs::write(&path, edited).expect("write");
    let cfg = RelayConfig::load(&path);
    let _ = std::fs::remove_file(&path);
    let cfg = cfg.unwrap_or_else(|e| panic!("the PostgreSQL lines load: {e}"));
    assert!(ahp_relay::names::pg::is_postgres_url(&cfg.relay.store));
    assert!(cfg.relay.store_password_file.is_some() && cfg.relay.store_ca_file.is_some());
}

/// `config/policy.example.toml` (the worked policy examples) loads, and its
/// rules grant what its comments say.
#[test]
fn policy_example_loads_and_means_what_it_says() {
    use ahp_relay::identity::PrincipalKey;
    use ahp_relay::policy::{HostRef, Permission, Policy, RulePolicy, Subject, Visibility};
    let cfg = load("policy.example.toml");
    let policy = RulePolicy::new(&cfg.policy);
    let key = |sub: &str| PrincipalKey {
        issuer: "https://idp.example.com/".into(),
        subject: sub.into(),
    };
    let gpu = HostRef {
        id: "gpu2",
        label: Some("gpu"),
    };
    let ci = HostRef {
        id: "buildbox",
        label: Some("ci"),
    };
    let (alice, bob, eve) = (key("alice"), key("bob"), key("eve"));
    let none: Vec<String> = Vec::new();
    let ml = vec!["ml".to_string()];
    let lead = policy
        .grant(
            Subject {
                principal: &alice,
                groups: &none,
            },
            gpu,
        )
        .expect("lead sees gpu2");
    assert_eq!(lead.visibility, Visibility::All);
    assert!(lead.external && lead.permits(Permission::SessionsOperate));
    let dev = policy
        .grant(
            Subject {
                principal: &eve,
                groups: &ml,
            },
            gpu,
        )
        .expect("ml sees gpu by label");
    assert_eq!(dev.visibility, Visibility::Group);
    assert!(!dev.external);
    assert!(
        policy
            .grant(
                Subject {
                    principal: &eve,
                    groups: &ml
                },
                ci
            )
            .is_none(),
        "ml never sees the build box"
    );
    let contractor = policy
        .grant(
            Subject {
                principal: &bob,
                groups: &none,
            },
            ci,
        )
        .expect("bob on ci");
    assert_eq!(contractor.visibility, Visibility::Own);
    assert!(!contractor.permits(Permission::FilesWrite) && !contractor.dispose_others);
    assert!(
        contractor.session_files && !contractor.permits(Permission::FilesRead),
        "bob's files are his sessions' working directories only"
    );
    assert!(
        policy
            .grant(
                Subject {
                    principal: &bob,
                    groups: &none
                },
                gpu
            )
            .is_none()
    );
}

/// A policy rule naming an unknown host is reported with the file and line
/// of the offending value; an unknown role with the parser's line.
#[test]
fn policy_errors_name_file_and_line() {
    let dir = std::env::temp_dir().join(format!("ahp-relay-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let base = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("config/relay.example.toml"),
    )
    .unwrap();
    let bad_host = format!(
        "{base}\n[[policy.rules]]\nsubjects = [\"x\"]\nhosts = [\"nowhere\"]\nrole = \"viewer\"\n"
    );
    let path = dir.join("bad-host.toml");
    std::fs::write(&path, &bad_host).unwrap();
    let line = bad_host
        .lines()
        .position(|l| l.contains("nowhere"))
        .unwrap()
        + 1;
    match RelayConfig::load(&path) {
        Err(ConfigError::InvalidAt {
            line: l, message, ..
        }) => {
            assert_eq!(l, line, "{message}");
            assert!(message.contains("nowhere"), "{message}");
        }
        other => panic!("expected an error at line {line}, got {other:?}"),
    }
    let bad_role =
        format!("{base}\n[[policy.rules]]\nsubjects = [\"x\"]\nhosts = [\"*\"]\nrole = \"root\"\n");
    std::fs::write(&path, &bad_role).unwrap();
    let line = bad_role
        .lines()
        .position(|l| l.contains("\"root\""))
        .unwrap()
        + 1;
    let e = RelayConfig::load(&path).unwrap_err().to_string();
    assert!(e.contains(&format!("line {line}")), "{e}");
    let scoped_admin = format!(
        "{base}\n[[policy.rules]]\nsubjects = [\"x\"]\nhosts = [\"*\"]\nrole = \"admin\"\n\
         files = \"session-dirs\"\n"
    );
    std::fs::write(&path, &scoped_admin).unwrap();
    let line = scoped_admin.lines().count();
    match RelayConfig::load(&path) {
        Err(ConfigError::InvalidAt {
            line: l, message, ..
        }) => {
            assert_eq!(l, line, "{message}");
            assert!(message.contains("session-dirs"), "{message}");
        }
        other => panic!("expected an error at line {line}, got {other:?}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The `relay.toml` of a ConfigMap manifest under the crate root.
fn configmap_toml(manifest: &str) -> String {
    let yaml = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(manifest))
        .expect("configmap");
    let start = yaml.find("relay.toml: |").expect("relay.toml key") + "relay.toml: |".len();
    yaml[start..]
        .lines()
        .skip(1)
        .map(|l| l.strip_prefix("    ").unwrap_or(l.trim_start()))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// Loads `toml` as a relay config file.
fn load_text(tag: &str, toml: &str) -> RelayConfig {
    let dir = std::env::temp_dir().join(format!("ahp-relay-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("relay.toml");
    std::fs::write(&path, toml).unwrap();
    let cfg = RelayConfig::load(&path);
    let _ = std::fs::remove_dir_all(&dir);
    cfg.unwrap_or_else(|e| panic!("{tag} relay.toml: {e}"))
}

/// The `relay.toml` shipped in `deploy/k8s/configmap.yaml` loads and validates.
#[test]
fn kubernetes_configmap_config_loads() {
    let cfg = load_text("k8s", &configmap_toml("deploy/k8s/configmap.yaml"));
    assert_eq!(cfg.hosts.len(), 2);
    assert_eq!(cfg.limits.drain_window_secs, 30);
    assert!(!cfg.policy.rules.is_empty());
}

/// The HA overlay's `relay.toml` (`deploy/k8s-ha`) loads, keeps the URI
/// store in PostgreSQL with the password and CA from the mounted Secret, and
/// differs from the base's in nothing else.
#[test]
fn kubernetes_ha_configmap_is_the_base_on_postgres() {
    let base = configmap_toml("deploy/k8s/configmap.yaml");
    let ha = configmap_toml("deploy/k8s-ha/configmap-patch.yaml");
    let cfg = load_text("k8s-ha", &ha);
    assert!(ahp_relay::names::pg::is_postgres_url(&cfg.relay.store));
    let mounted = |p: &Option<std::path::PathBuf>| {
        p.as_ref()
            .is_some_and(|p| p.starts_with("/etc/ahp-relay/store"))
    };
    assert!(mounted(&cfg.relay.store_password_file) && mounted(&cfg.relay.store_ca_file));
    let other = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| !l.starts_with("store") && !l.starts_with('#'))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(
        other(&ha),
        other(&base),
        "the overlay changes only the store"
    );
}

/// A `[[hosts]]` entry that is wrong is reported with the line of its table
/// header, like every other config error (issue 23).
#[test]
fn host_errors_name_file_and_line() {
    let dir = std::env::temp_dir().join(format!("ahp-relay-host-lines-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("relay.toml");
    let text = "[listen]\naddr = \"127.0.0.1:0\"\nplaintext = true\n\n[[auth.issuers]]\n\
                issuer = \"x\"\naudience = [\"y\"]\n\
                keys = { type = \"hs256\", secret_file = \"/k\" }\n\n[relay]\n\
                secret_file = \"/s\"\nstore = \"/u\"\n\n[[hosts]]\nid = \"a\"\n\
                url = \"wss://a.example/\"\n\n[[hosts]]\nid = \"b\"\nurl = \"ws://b.example/\"\n";
    std::fs::write(&path, text).expect("write");
    let err = RelayConfig::load(&path).expect_err("ws:// without allow_plaintext");
    let shown = err.to_string();
    assert!(
        shown.ends_with("relay.toml:18: host b: ws:// needs allow_plaintext = true"),
        "{shown}"
    );
    let dup = text.replace("id = \"b\"\nurl = \"ws://", "id = \"a\"\nurl = \"wss://");
    std::fs::write(&path, dup).expect("write");
    let shown = RelayConfig::load(&path)
        .expect_err("duplicate id")
        .to_string();
    assert!(
        shown.ends_with("relay.toml:18: host id \"a\" appears twice"),
        "{shown}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
