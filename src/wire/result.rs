//! The members of a response's `result` the relay reads: sequence numbers and snapshots.

use super::WireError;
use super::fields::{SeqField, StrField};
use super::raw::{ResultRaw, Shaped, SnapshotRaw, object};

/// Paths of `result.snapshot`'s members, for error messages.
const SNAPSHOT: [&str; 2] = ["result.snapshot.fromSeq", "result.snapshot.resource"];
/// Paths of `result.snapshots[i]`'s members, for error messages.
const SNAPSHOTS: [&str; 2] = ["result.snapshots[].fromSeq", "result.snapshots[].resource"];

/// What [`classify`](super::classify) read from `result`. Empty unless the frame is a
/// response whose `result` is an object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResultFields<'a> {
    /// `result.serverSeq` (`InitializeResult`).
    pub server_seq: Option<SeqField>,
    /// `result.snapshot` (`SubscribeResult`), when it is an object.
    pub snapshot: Option<SnapshotFields<'a>>,
    /// `result.snapshots[i]` (`InitializeResult`, `ReconnectSnapshotResult`), one entry
    /// per array element in order; an element that is not an object gives an empty entry,
    /// so indices match the array. Empty if `snapshots` is absent or not an array.
    pub snapshots: Vec<SnapshotFields<'a>>,
}

/// What [`classify`](super::classify) read from one `Snapshot` object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotFields<'a> {
    /// `fromSeq`.
    pub from_seq: Option<SeqField>,
    /// `resource` (the channel URI the snapshot is of).
    pub resource: Option<StrField<'a>>,
}

impl<'a> ResultFields<'a> {
    /// Interprets the raw `result` of a response; `None` means absent.
    pub(super) fn read(
        text: &'a str,
        raw: Option<Shaped<ResultRaw<'a>>>,
    ) -> Result<Self, WireError> {
        let Some(result) = raw.map(object).transpose()?.flatten() else {
            return Ok(Self::default());
        };
        let snapshot = match result.snapshot {
            Some(raw) => SnapshotFields::read(text, raw, SNAPSHOT)?,
            None => None,
        };
        let snapshots = result
            .snapshots
            .flatten()
            .unwrap_or_default()
            .into_iter()
            .map(|raw| SnapshotFields::read(text, raw, SNAPSHOTS))
            .map(|read| read.map(Option::unwrap_or_default))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            server_seq: result
                .server_seq
                .map(|raw| SeqField::new(text, raw.get(), "result.serverSeq"))
                .transpose()?,
            snapshot,
            snapshots,
        })
    }
}

impl<'a> SnapshotFields<'a> {
    /// Interprets one raw snapshot; `None` if it is not an object. `names` are the
    /// paths of its `fromSeq` and `resource` for error messages.
    fn read(
        text: &'a str,
        raw: Shaped<SnapshotRaw<'a>>,
        [from_seq_field, resource_field]: [&'static str; 2],
    ) -> Result<Option<Self>, WireError> {
        let Some(snapshot) = object(raw)? else {
            return Ok(None);
        };
        Ok(Some(Self {
            from_seq: snapshot
                .from_seq
                .map(|raw| SeqField::new(text, raw.get(), from_seq_field))
                .transpose()?,
            resource: snapshot
                .resource
                .map(|raw| StrField::new(text, raw.get(), resource_field))
                .transpose()?,
        }))
    }
}
