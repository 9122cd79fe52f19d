//! The shipped example configuration loads and validates (contract §8.1).

use std::path::Path;

/// `config/relay.example.toml` parses with `RelayConfig::load` and passes validation.
#[test]
fn example_config_loads_and_validates() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/relay.example.toml");
    let cfg = ahp_relay::config::RelayConfig::load(&path)
        .unwrap_or_else(|e| panic!("{} does not load: {e}", path.display()));
    cfg.auth
        .validate()
        .unwrap_or_else(|e| panic!("{}: [auth] does not validate: {e}", path.display()));
    assert!(!cfg.auth.issuers.is_empty(), "the example names an issuer");
}
