//! Byte scans that need no parser: string skipping, and finding one member of an object
//! that serde_json has already validated.

use super::WireError;

/// The bytes after the closing quote of a string whose opening quote was just consumed
/// (empty if the string is unterminated). Works on unvalidated input.
pub(super) fn after_string(mut rest: &[u8]) -> &[u8] {
    while let Some(pos) = memchr::memchr2(b'"', b'\\', rest) {
        let quote = rest.get(pos) == Some(&b'"');
        // A backslash escapes the next byte; `"` and `\` never occur inside a multi-byte
        // UTF-8 character, so stepping over one byte cannot land on a false quote.
        let skip = if quote { pos + 1 } else { pos + 2 };
        match rest.get(skip..) {
            Some(after) if quote => return after,
            Some(after) => rest = after,
            None => return &[],
        }
    }
    &[]
}

/// The value token of member `key` of `object`, a JSON value serde_json has already
/// validated: `Ok(None)` if `object` is not an object or lacks `key`, and
/// [`WireError::DuplicateKey`] if `key` occurs twice. Keys are compared after
/// unescaping; a key whose escapes do not decode (a lone surrogate) matches nothing.
pub(super) fn member<'a>(object: &'a str, key: &'static str) -> Result<Option<&'a str>, WireError> {
    let Some(mut rest) = skip_ws(object.as_bytes()).strip_prefix(b"{") else {
        return Ok(None);
    };
    let mut found = None;
    loop {
        rest = skip_ws(rest);
        if rest.starts_with(b"}") {
            return Ok(found);
        }
        let name = rest
            .strip_prefix(b"\"")
            .map(after_string)
            .ok_or(WireError::Internal)?;
        let name = token(object, rest, name)?;
        rest = skip_ws(rest.get(name.len()..).unwrap_or_default());
        rest = skip_ws(rest.strip_prefix(b":").ok_or(WireError::Internal)?);
        let value = token(object, rest, after_value(rest))?;
        if key_is(name, key) {
            if found.is_some() {
                return Err(WireError::DuplicateKey { key });
            }
            found = Some(value);
        }
        rest = skip_ws(rest.get(value.len()..).unwrap_or_default());
        rest = rest.strip_prefix(b",").unwrap_or(rest);
    }
}

/// The part of `object` from `start` up to `end`, both tails of `object`'s bytes.
fn token<'a>(object: &'a str, start: &[u8], end: &[u8]) -> Result<&'a str, WireError> {
    let from = object.len().checked_sub(start.len());
    let to = object.len().checked_sub(end.len());
    from.zip(to)
        .and_then(|(from, to)| object.get(from..to))
        .filter(|t| !t.is_empty())
        .ok_or(WireError::Internal)
}

/// Whether the string token `name` decodes to `key`.
fn key_is(name: &str, key: &str) -> bool {
    let inner = name
        .strip_prefix('"')
        .and_then(|n| n.strip_suffix('"'))
        .unwrap_or_default();
    if inner.contains('\\') {
        serde_json::from_str::<String>(name).is_ok_and(|decoded| decoded == key)
    } else {
        inner == key
    }
}

/// `bytes` without leading JSON whitespace.
fn skip_ws(bytes: &[u8]) -> &[u8] {
    let start = bytes
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        .unwrap_or(bytes.len());
    bytes.get(start..).unwrap_or_default()
}

/// The bytes after the valid JSON value `rest` starts with.
fn after_value(rest: &[u8]) -> &[u8] {
    match rest.split_first() {
        Some((b'"', tail)) => after_string(tail),
        Some((b'{' | b'[', tail)) => after_container(tail),
        _ => {
            let end = rest
                .iter()
                .position(|b| matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
                .unwrap_or(rest.len());
            rest.get(end..).unwrap_or_default()
        }
    }
}

/// The bytes after the container whose opening bracket was just consumed.
fn after_container(mut rest: &[u8]) -> &[u8] {
    let mut depth = 1usize;
    while let Some(pos) = rest
        .iter()
        .position(|b| matches!(b, b'"' | b'{' | b'[' | b'}' | b']'))
    {
        let (Some(&byte), Some(after)) = (rest.get(pos), rest.get(pos + 1..)) else {
            return &[];
        };
        rest = match byte {
            b'"' => after_string(after),
            b'{' | b'[' => {
                depth += 1;
                after
            }
            _ => {
                depth -= 1;
                if depth == 0 {
                    return after;
                }
                after
            }
        };
    }
    &[]
}

#[cfg(test)]
mod tests {
    use super::{WireError, member};

    #[test]
    fn finds_members_of_validated_objects() {
        let object = r#" { "a" : [1,{"type":"no"},"]"] , "t\u0079pe":"x\"}" ,"n":-1.5e3,"z":{}} "#;
        assert_eq!(member(object, "type"), Ok(Some(r#""x\"}""#)));
        assert_eq!(member(object, "a"), Ok(Some(r#"[1,{"type":"no"},"]"]"#)));
        assert_eq!(member(object, "n"), Ok(Some("-1.5e3")));
        assert_eq!(member(object, "z"), Ok(Some("{}")));
        assert_eq!(member(object, "b"), Ok(None));
        assert_eq!(member("{}", "type"), Ok(None));
        assert_eq!(member(r#""type""#, "type"), Ok(None));
        assert_eq!(
            member(r#"{"\ud800":1,"type":true}"#, "type"),
            Ok(Some("true"))
        );
        assert_eq!(
            member(r#"{"type":1,"typ\u0065":2}"#, "type"),
            Err(WireError::DuplicateKey { key: "type" })
        );
    }
}
