//! Round trips of every URI shape (contract §4.2).

use super::*;

fn none(_: &str) -> bool {
    false
}

fn b64(s: &str) -> String {
    B64.encode(s)
}

/// Qualifies `uri` from `host`, reads the result back and checks it names
/// `uri` on `host`; returns the client form.
fn round_trip(host: &str, uri: &str) -> String {
    let client = qualify(host, uri, none).expect("qualifiable");
    assert_eq!(
        read_client_uri(&client),
        Ok(ClientName::Qualified {
            host: host.into(),
            host_uri: uri.into()
        }),
        "{uri} -> {client}"
    );
    client
}

#[test]
fn path_form_uris_of_every_scheme() {
    assert_eq!(
        round_trip("gpu1", "ahp-terminal:/7"),
        "ahp-terminal:/gpu1~7"
    );
    assert_eq!(
        round_trip("a", "ahp-session:/s1/annotations"),
        "ahp-session:/a~s1/annotations"
    );
    assert_eq!(
        round_trip("gpu1", "agenthost-terminal:/7"),
        "agenthost-terminal:/gpu1~7"
    );
    assert_eq!(round_trip("b", "ahp-content:/12"), "ahp-content:/b~12");
    assert_eq!(
        round_trip("b", "ahp-changeset:/c/x"),
        "ahp-changeset:/b~c/x"
    );
    // A host id that itself contains the qualifier still reads back.
    assert_eq!(round_trip("h", "ahp-session:/a~b"), "ahp-session:/h~a~b");
}

/// VS Code's provider-scheme sessions carry the host in the scheme: the
/// client form's scheme is the provider id clients are shown, so a session
/// VS Code mints from that provider (`AgentSession.uri(provider, id)`) and
/// the one it lists are spelled alike; the old path spelling names nothing.
#[test]
fn provider_scheme_sessions_are_qualified_in_their_scheme() {
    assert_eq!(round_trip("gpu1", "copilot:/abc"), "copilot.gpu1:/abc");
    assert_eq!(
        round_trip("gpu-1", "copilot:/abc/x"),
        "copilot.gpu+1:/abc/x"
    );
    assert_eq!(round_trip("h", "sim:/a~b"), "sim.h:/a~b");
    assert_eq!(
        qualify("gpu1", "copilot:/abc", |_| true),
        Ok("copilot.gpu1:/abc".into()),
        "a store entry is spelled the same"
    );
    assert_eq!(read_client_uri("copilot:/gpu1~abc"), Err(NotAHostUri));
    assert_eq!(read_client_uri("copilot:/abc"), Err(NotAHostUri));
    assert_eq!(read_client_uri("copilot.gpu-1:/abc"), Err(NotAHostUri));
    assert_eq!(channel_kind("copilot.gpu1:/abc"), ChannelKind::Session);
    assert_eq!(
        channel_kind("agenthost-terminal:/gpu1~7"),
        ChannelKind::Terminal
    );
    // Terminals VS Code's shell tools mint on the host keep their authority.
    assert_eq!(
        round_trip("gpu1", "agenthost-terminal://shell/s1/tc-1"),
        "agenthost-terminal://shell/gpu1~s1/tc-1"
    );
    assert_eq!(
        channel_kind("agenthost-terminal://shell/gpu1~s1"),
        ChannelKind::Terminal
    );
    assert_eq!(
        read_client_uri("agenthost-terminal://shell/s1"),
        Err(NotAHostUri)
    );
    let scheme = qualify_provider("gpu1", "copilot");
    assert_eq!(round_trip("gpu1", "copilot:/abc"), format!("{scheme}:/abc"));
}

#[test]
fn schemes_compare_case_insensitively_and_keep_their_spelling() {
    assert_eq!(round_trip("h", "AHP-Session:/x"), "AHP-Session:/h~x");
    assert_eq!(round_trip("h", "FILE:///p"), "FILE://h/p");
    assert_eq!(qualify("h", "HTTPS://x/y", none), Ok("HTTPS://x/y".into()));
    assert_eq!(channel_kind("AHP-CHAT:/x"), ChannelKind::Chat);
    assert_eq!(channel_kind("Ahp-Terminal:/h~x"), ChannelKind::Terminal);
}

#[test]
fn authority_form_chats_qualify_the_embedded_session() {
    let host_chat = format!("ahp-chat://default/{}", b64("copilot:/abc"));
    let client_chat = round_trip("gpu1", &host_chat);
    // Exactly what a client derives from the qualified session.
    assert_eq!(
        client_chat,
        format!("ahp-chat://default/{}", b64("copilot.gpu1:/abc"))
    );
    assert_eq!(
        session_of_chat_uri(&client_chat).as_deref(),
        Some("copilot.gpu1:/abc")
    );
    let sub = format!("ahp-chat://worker-2/{}/x", b64("ahp-session:/s"));
    assert_eq!(
        round_trip("h", &sub),
        format!("ahp-chat://worker-2/{}/x", b64("ahp-session:/h~s"))
    );
    assert_eq!(channel_kind(&client_chat), ChannelKind::Chat);
}

#[test]
fn file_uris_carry_the_host_in_the_authority() {
    assert_eq!(
        round_trip("gpu1", "file:///home/u/p"),
        "file://gpu1/home/u/p"
    );
    assert_eq!(
        qualify("gpu1", "file://localhost/etc", none),
        Ok("file://gpu1/etc".into())
    );
    assert_eq!(
        read_client_uri("file:///etc/passwd"),
        Ok(ClientName::LocalFile {
            host_uri: "file:///etc/passwd".into()
        })
    );
    assert_eq!(read_client_uri("file://Bad_Host/x"), Err(NotAHostUri));
    assert_eq!(
        qualify("h", "file://server/share", none),
        Err(Unqualifiable)
    );
}

#[test]
fn unqualifiable_host_uris_are_refused() {
    for uri in [
        "ahp-chat://default/!!",
        &format!("ahp-chat://default/{}", b64("https://x")),
        "ahp-chat://default",
        "ahp-foo://x/y",
        "ahp-foo:opaque",
        "copilot:/",
        "file:relative",
    ] {
        assert_eq!(qualify("h", uri, none), Err(Unqualifiable), "{uri}");
    }
}

#[test]
fn external_and_client_published_uris_pass_unchanged() {
    for uri in [
        "ahp-root://",
        "ahp-automations://",
        "https://example.com/a",
        "http://x",
        "data:text/plain,hi",
        "vscode-agent-client://client-1/file/-/Users/u/plugin",
        "virtual://my-client/plugin",
        "urn:x:y",
        "not a uri",
    ] {
        assert_eq!(qualify("h", uri, none).as_deref(), Ok(uri), "{uri}");
        assert_eq!(read_client_uri(uri), Err(NotAHostUri), "{uri}");
        assert!(!is_host_name(uri) || uri.starts_with("ahp-"), "{uri}");
    }
}

#[test]
fn store_entries_stay_verbatim() {
    let store = |base: &str| base == "ahp-session:/mine";
    assert_eq!(
        qualify("a", "ahp-session:/mine/annotations", store),
        Ok("ahp-session:/mine/annotations".into())
    );
    assert_eq!(
        qualify("a", "ahp-chat:/mine", store),
        Ok("ahp-chat:/a~mine".into())
    );
    // A chat of a client-chosen session embeds the verbatim session.
    let chat = format!("ahp-chat://default/{}", b64("ahp-session:/mine"));
    assert_eq!(qualify("a", &chat, store), Ok(chat.clone()));
    assert_eq!(
        read_client_uri(&chat),
        Ok(ClientName::Verbatim {
            key: "ahp-session:/mine".into()
        })
    );
    assert_eq!(
        read_client_uri("ahp-chat:/mine"),
        Ok(ClientName::Verbatim {
            key: "ahp-chat:/mine".into()
        })
    );
}

#[test]
fn malformed_client_forms() {
    assert_eq!(read_client_uri("ahp-chat:/~x"), Err(NotAHostUri));
    assert_eq!(read_client_uri("ahp-chat:/h~"), Err(NotAHostUri));
    assert_eq!(read_client_uri("ahp-chat://x"), Err(NotAHostUri));
    assert_eq!(read_client_uri("ahp-chat://default/%%"), Err(NotAHostUri));
}

#[test]
fn channel_kinds() {
    assert_eq!(channel_kind("copilot:/h~abc"), ChannelKind::Session);
    assert_eq!(channel_kind("ahp-session:/x"), ChannelKind::Session);
    assert_eq!(channel_kind("ahp-changeset:/x"), ChannelKind::Other);
    assert_eq!(channel_kind("file:///x"), ChannelKind::Other);
    assert_eq!(channel_kind("ahp-root://"), ChannelKind::Other);
}

#[test]
fn templates_qualify_their_literal_part() {
    let q = |t: &str| map_template(t, |m| qualify("h", m, none), Unqualifiable);
    assert_eq!(
        q("ahp-changeset:/s/{turnId}"),
        Ok("ahp-changeset:/h~s/{turnId}".into())
    );
    assert_eq!(
        q("ahp-changeset:/{originalTurnId}-{modifiedTurnId}"),
        Ok("ahp-changeset:/h~{originalTurnId}-{modifiedTurnId}".into())
    );
    assert_eq!(q("file:///w/{x}"), Ok("file://h/w/{x}".into()));
    assert_eq!(q("ahp-changeset:/{unclosed"), Err(Unqualifiable));
    // Expansion commutes with qualification.
    let expanded = qualify("h", "ahp-changeset:/s/t1", none);
    assert_eq!(expanded, Ok("ahp-changeset:/h~s/t1".into()));
}

#[test]
fn host_ids_and_providers() {
    assert!(valid_host_id("gpu-1"));
    assert!(!valid_host_id("localhost"));
    assert!(!valid_host_id("GPU"));
    assert!(!valid_host_id(""));
    assert_eq!(qualify_provider("b", "copilot"), "copilot.b");
    assert_eq!(qualify_provider("gpu-1", "copilot"), "copilot.gpu+1");
    assert_eq!(
        read_provider("copilot.gpu+1"),
        Some(("copilot", "gpu-1".into()))
    );
    assert_eq!(read_provider("co.pilot.b"), Some(("co.pilot", "b".into())));
    // One spelling per host: the host id's `-` is always `_`.
    assert_eq!(read_provider("copilot.gpu-1"), None);
    assert_eq!(read_provider("copilot"), None);
    assert_eq!(read_provider(".b"), None);
    // The client form is a legal URI scheme (RFC 3986, VS Code's
    // `^\w[\w\d+.-]*$`) without `-` (VS Code reads a provider back after
    // the last `-`).
    let scheme = qualify_provider("gpu-1", "copilot");
    assert!(
        scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+.".contains(&b))
    );
}

#[test]
fn chats_move_between_namespaces_with_their_session() {
    let client = format!("ahp-chat://side-1/{}", b64("copilot:/h~s"));
    assert_eq!(
        chat_for_session(&client, "copilot:/s"),
        Some(format!("ahp-chat://side-1/{}", b64("copilot:/s")))
    );
    assert_eq!(chat_for_session("ahp-chat:/x", "copilot:/s"), None);
}
