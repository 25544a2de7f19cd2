//! Durations as fractional seconds in JSON, which reads well in traces and agent files.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

/// A `Duration` as seconds (f64).
pub(crate) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// A `Duration` from seconds (f64); negative or non-finite values are refused.
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let secs = f64::deserialize(d)?;
    Duration::try_from_secs_f64(secs).map_err(serde::de::Error::custom)
}

/// An `Option<Duration>` as seconds.
pub(crate) mod option {
    use super::*;

    /// Serializes.
    pub(crate) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&d.as_secs_f64()),
            None => s.serialize_none(),
        }
    }

    /// Deserializes.
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        match Option::<f64>::deserialize(d)? {
            Some(secs) => Duration::try_from_secs_f64(secs)
                .map(Some)
                .map_err(serde::de::Error::custom),
            None => Ok(None),
        }
    }
}
