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
        // The stored form (`aa:bb:cc:dd:ee:ff`) without an allocation: every lease row read.
        if let Some(mac) = Self::parse_colon(s.as_bytes()) {
            return Ok(mac);
        }
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

impl MacAddr {
    /// The colon form's 17 bytes (`aa:bb:cc:dd:ee:ff`), written without the formatting
    /// machinery: every lease write and inventory look-up binds a MAC as text.
    fn colon_form(&self) -> [u8; 17] {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut out = [b':'; 17];
        for (i, o) in self.0.iter().enumerate() {
            out[i * 3] = HEX[usize::from(o >> 4)];
            out[i * 3 + 1] = HEX[usize::from(o & 0xf)];
        }
        out
    }

    /// Parse exactly `xx:xx:xx:xx:xx:xx` (either case).
    fn parse_colon(b: &[u8]) -> Option<MacAddr> {
        fn nibble(c: u8) -> Option<u8> {
            match c {
                b'0'..=b'9' => Some(c - b'0'),
                b'a'..=b'f' => Some(c - b'a' + 10),
                b'A'..=b'F' => Some(c - b'A' + 10),
                _ => None,
            }
        }
        if b.len() != 17 {
            return None;
        }
        let mut out = [0u8; 6];
        for (i, o) in out.iter_mut().enumerate() {
            if i > 0 && b[i * 3 - 1] != b':' {
                return None;
            }
            *o = nibble(b[i * 3])? << 4 | nibble(b[i * 3 + 1])?;
        }
        Some(MacAddr(out))
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.colon_form();
        // Hex digits and colons only: always UTF-8.
        f.pad(std::str::from_utf8(&text).map_err(|_| fmt::Error)?)
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
