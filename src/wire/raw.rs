//! The serde_json pass: visitors that keep, per object level, only the members routing
//! reads (as borrowed `&RawValue` slices of the frame) and skip everything else with
//! `IgnoredAny`, which validates without building anything.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::WireError;

/// What kind of JSON value a position held; `Object` carries the members read from it.
pub(super) enum Shaped<T> {
    /// A JSON object, with the members this level reads.
    Object(T),
    /// A JSON array (its elements were validated and skipped).
    Array,
    /// A string, number, `true`, `false` or `null`.
    Scalar,
}

/// The members of one object level that the wire layer reads.
pub(super) trait Members<'de>: Default {
    /// Keys read at this level; any other key's value is skipped.
    const NAMES: &'static [&'static str];
    /// Reads the value of `name` (one of [`Self::NAMES`]) from `map`.
    fn read<A: MapAccess<'de>>(&mut self, name: &'static str, map: &mut A) -> Result<(), A::Error>;
    /// The first key of [`Self::NAMES`] seen twice at this level, if any.
    fn duplicate(&self) -> Option<&'static str>;
}

/// Parses `text` as one JSON value, reading the members of `T` if it is an object.
/// Fails only on invalid JSON (including trailing characters).
pub(super) fn parse<'de, T: Members<'de>>(text: &'de str) -> Result<Shaped<T>, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    let shaped = ShapeSeed::<T>(PhantomData).deserialize(&mut de)?;
    de.end()?;
    Ok(shaped)
}

/// `members`, unless a key it reads occurred twice ([`WireError::DuplicateKey`]).
pub(super) fn unique<'de, T: Members<'de>>(members: T) -> Result<T, WireError> {
    match members.duplicate() {
        Some(key) => Err(WireError::DuplicateKey { key }),
        None => Ok(members),
    }
}

/// The members of `shaped` if it is an object (duplicates refused), `None` otherwise.
pub(super) fn object<'de, T: Members<'de>>(shaped: Shaped<T>) -> Result<Option<T>, WireError> {
    match shaped {
        Shaped::Object(members) => unique(members).map(Some),
        Shaped::Array | Shaped::Scalar => Ok(None),
    }
}

/// Stores `value` in an empty `slot`, or records `name` as duplicated.
fn keep<T>(slot: &mut Option<T>, value: T, name: &'static str, dup: &mut Option<&'static str>) {
    if slot.is_some() {
        dup.get_or_insert(name);
    } else {
        *slot = Some(value);
    }
}

/// Matches a key (escapes already decoded by serde_json) against a fixed list, without
/// allocating.
struct KeySeed(&'static [&'static str]);

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Option<&'static str>;
    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Self::Value, D::Error> {
        de.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = Option<&'static str>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object key")
    }
    fn visit_str<E>(self, key: &str) -> Result<Self::Value, E> {
        Ok(self.0.iter().copied().find(|name| *name == key))
    }
}

/// Accepts any value; reads the members of `T` if it is an object.
struct ShapeSeed<T>(PhantomData<T>);

/// Visitor methods for scalars, all answering `$value`.
macro_rules! scalars_are {
    ($value:expr) => {
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok($value)
        }
    };
}

impl<'de, T: Members<'de>> DeserializeSeed<'de> for ShapeSeed<T> {
    type Value = Shaped<T>;
    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Self::Value, D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de, T: Members<'de>> Visitor<'de> for ShapeSeed<T> {
    type Value = Shaped<T>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    scalars_are!(Shaped::Scalar);
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Shaped::Array)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut members = T::default();
        while let Some(key) = map.next_key_seed(KeySeed(T::NAMES))? {
            match key {
                Some(name) => members.read(name, &mut map)?,
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Shaped::Object(members))
    }
}

/// Accepts any value; if it is an array, reads each element with [`ShapeSeed`].
/// `None` means "not an array".
struct ListSeed<T>(PhantomData<T>);

impl<'de, T: Members<'de>> DeserializeSeed<'de> for ListSeed<T> {
    type Value = Option<Vec<Shaped<T>>>;
    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Self::Value, D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de, T: Members<'de>> Visitor<'de> for ListSeed<T> {
    type Value = Option<Vec<Shaped<T>>>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    scalars_are!(None);
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(item) = seq.next_element_seed(ShapeSeed::<T>(PhantomData))? {
            items.push(item);
        }
        Ok(Some(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(None)
    }
}

/// Top level of a frame.
#[derive(Default)]
pub(super) struct TopRaw<'de> {
    /// `jsonrpc`, raw.
    pub jsonrpc: Option<&'de RawValue>,
    /// `id`, raw.
    pub id: Option<&'de RawValue>,
    /// `method`, raw.
    pub method: Option<&'de RawValue>,
    /// `params`, read one level down.
    pub params: Option<Shaped<ParamsRaw<'de>>>,
    /// `result`, read one level down.
    pub result: Option<Shaped<ResultRaw<'de>>>,
    /// `error`, raw.
    pub error: Option<&'de RawValue>,
    /// First key of `NAMES` seen twice here.
    duplicate: Option<&'static str>,
}

impl<'de> Members<'de> for TopRaw<'de> {
    const NAMES: &'static [&'static str] =
        &["jsonrpc", "id", "method", "params", "result", "error"];
    fn read<A: MapAccess<'de>>(&mut self, name: &'static str, map: &mut A) -> Result<(), A::Error> {
        let dup = &mut self.duplicate;
        match name {
            "params" => keep(
                &mut self.params,
                map.next_value_seed(ShapeSeed(PhantomData))?,
                name,
                dup,
            ),
            "result" => keep(
                &mut self.result,
                map.next_value_seed(ShapeSeed(PhantomData))?,
                name,
                dup,
            ),
            "jsonrpc" => keep(&mut self.jsonrpc, map.next_value()?, name, dup),
            "id" => keep(&mut self.id, map.next_value()?, name, dup),
            "method" => keep(&mut self.method, map.next_value()?, name, dup),
            "error" => keep(&mut self.error, map.next_value()?, name, dup),
            _ => drop(map.next_value::<IgnoredAny>()?),
        }
        Ok(())
    }
    fn duplicate(&self) -> Option<&'static str> {
        self.duplicate
    }
}

/// `params` of a request or notification.
#[derive(Default)]
pub(super) struct ParamsRaw<'de> {
    /// `channel`, raw.
    pub channel: Option<&'de RawValue>,
    /// `serverSeq`, raw.
    pub server_seq: Option<&'de RawValue>,
    /// `action`, raw (its `type` is found by `scan::member`).
    pub action: Option<&'de RawValue>,
    /// `origin`, raw (its `clientId` is found by `scan::member`).
    pub origin: Option<&'de RawValue>,
    /// First key of `NAMES` seen twice here.
    duplicate: Option<&'static str>,
}

impl<'de> Members<'de> for ParamsRaw<'de> {
    const NAMES: &'static [&'static str] = &["channel", "serverSeq", "action", "origin"];
    fn read<A: MapAccess<'de>>(&mut self, name: &'static str, map: &mut A) -> Result<(), A::Error> {
        let slot = match name {
            "channel" => &mut self.channel,
            "serverSeq" => &mut self.server_seq,
            "action" => &mut self.action,
            "origin" => &mut self.origin,
            _ => return map.next_value::<IgnoredAny>().map(drop),
        };
        keep(slot, map.next_value()?, name, &mut self.duplicate);
        Ok(())
    }
    fn duplicate(&self) -> Option<&'static str> {
        self.duplicate
    }
}

/// `result` of a response.
#[derive(Default)]
pub(super) struct ResultRaw<'de> {
    /// `serverSeq`, raw.
    pub server_seq: Option<&'de RawValue>,
    /// `snapshot`, read one level down.
    pub snapshot: Option<Shaped<SnapshotRaw<'de>>>,
    /// `snapshots`: outer `None` if absent, inner `None` if not an array.
    pub snapshots: Option<Option<Vec<Shaped<SnapshotRaw<'de>>>>>,
    /// First key of `NAMES` seen twice here.
    duplicate: Option<&'static str>,
}

impl<'de> Members<'de> for ResultRaw<'de> {
    const NAMES: &'static [&'static str] = &["serverSeq", "snapshot", "snapshots"];
    fn read<A: MapAccess<'de>>(&mut self, name: &'static str, map: &mut A) -> Result<(), A::Error> {
        let dup = &mut self.duplicate;
        match name {
            "serverSeq" => keep(&mut self.server_seq, map.next_value()?, name, dup),
            "snapshot" => keep(
                &mut self.snapshot,
                map.next_value_seed(ShapeSeed(PhantomData))?,
                name,
                dup,
            ),
            "snapshots" => keep(
                &mut self.snapshots,
                map.next_value_seed(ListSeed(PhantomData))?,
                name,
                dup,
            ),
            _ => drop(map.next_value::<IgnoredAny>()?),
        }
        Ok(())
    }
    fn duplicate(&self) -> Option<&'static str> {
        self.duplicate
    }
}

/// One `Snapshot` inside a result.
#[derive(Default)]
pub(super) struct SnapshotRaw<'de> {
    /// `fromSeq`, raw.
    pub from_seq: Option<&'de RawValue>,
    /// `resource`, raw.
    pub resource: Option<&'de RawValue>,
    /// First key of `NAMES` seen twice here.
    duplicate: Option<&'static str>,
}

impl<'de> Members<'de> for SnapshotRaw<'de> {
    const NAMES: &'static [&'static str] = &["fromSeq", "resource"];
    fn read<A: MapAccess<'de>>(&mut self, name: &'static str, map: &mut A) -> Result<(), A::Error> {
        let slot = match name {
            "fromSeq" => &mut self.from_seq,
            "resource" => &mut self.resource,
            _ => return map.next_value::<IgnoredAny>().map(drop),
        };
        keep(slot, map.next_value()?, name, &mut self.duplicate);
        Ok(())
    }
    fn duplicate(&self) -> Option<&'static str> {
        self.duplicate
    }
}
