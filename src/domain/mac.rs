//! `MacAddr`: a 48-bit Ethernet address, parsed leniently from the forms operators paste
//! (`aa:bb:cc:dd:ee:ff`, `AA-BB-CC-DD-EE-FF`, `aabb.ccdd.eeff`, `aabbccddeeff`) and always shown in
//! lower-case colon form, which is also how it is stored.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A 48-bit MAC address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

/// Why a MAC address could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a MAC address; expected six hex octets such as 52:54:00:12:34:56")]
pub struct MacParseError(pub String);

impl MacAddr {
    /// The six octets.
    pub fn octets(&self) -> [u8; 6] {
        self.0
    }
}

impl FromStr for MacAddr {
    type Err = MacParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let hex: String = s
            .trim()
            .chars()
            .filter(|c| !matches!(c, ':' | '-' | '.'))
            .collect();
        let seps = s
            .trim()
            .chars()
            .filter(|c| matches!(c, ':' | '-' | '.'))
            .count();
        if hex.len() != 12 || !(seps == 0 || seps == 5 || seps == 2) {
            return Err(MacParseError(s.to_string()));
        }
        let mut out = [0u8; 6];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(&hex[i * 2..i * 2 + 2], 16)
                .map_err(|_| MacParseError(s.to_string()))?;
        }
        Ok(MacAddr(out))
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            o[0], o[1], o[2], o[3], o[4], o[5]
        )
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Serialize for MacAddr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl utoipa::PartialSchema for MacAddr {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .pattern(Some("^([0-9a-f]{2}:){5}[0-9a-f]{2}$"))
            .examples([serde_json::json!("52:54:00:12:34:56")])
            .into()
    }
}

impl utoipa::ToSchema for MacAddr {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_common_forms() {
        for s in [
            "52:54:00:AB:cd:ef",
            "52-54-00-ab-cd-ef",
            "5254.00ab.cdef",
            "525400abcdef",
            " 52:54:00:ab:cd:ef ",
        ] {
            let m: MacAddr = s.parse().expect(s);
            assert_eq!(m.to_string(), "52:54:00:ab:cd:ef");
        }
    }

    #[test]
    fn refuses_garbage() {
        for s in [
            "",
            "52:54:00:ab:cd",
            "52:54:00:ab:cd:ef:01",
            "zz:54:00:ab:cd:ef",
            "5:254:00:ab:cd:ef:",
            "52:54:00:ab:cdef",
        ] {
            assert!(s.parse::<MacAddr>().is_err(), "{s}");
        }
    }
}
