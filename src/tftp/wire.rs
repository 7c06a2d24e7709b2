//! TFTP packets: requests, DATA, ACK, ERROR (RFC 1350 section 5) and the option extension's OACK
//! (RFC 2347), with the options Plinth negotiates: blksize (RFC 2348), timeout and tsize
//! (RFC 2349), windowsize (RFC 7440). Pure functions over byte slices: no sockets, no files.

/// Opcodes, RFC 1350 section 5 and RFC 2347.
const OP_RRQ: u16 = 1;
const OP_WRQ: u16 = 2;
const OP_DATA: u16 = 3;
const OP_ACK: u16 = 4;
const OP_ERROR: u16 = 5;
const OP_OACK: u16 = 6;

/// Bytes before a DATA packet's payload: opcode and block number.
pub const DATA_HEADER: usize = 4;

/// Error codes, RFC 1350 section 5 (and 8 from RFC 2347).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    /// 0: not defined, see the message.
    NotDefined = 0,
    /// 1: file not found.
    FileNotFound = 1,
    /// 2: access violation.
    AccessViolation = 2,
    /// 4: illegal TFTP operation.
    IllegalOperation = 4,
    /// 8: the transfer ends because of option negotiation (RFC 2347).
    OptionRefused = 8,
}

impl ErrorCode {
    /// The message sent with the code: generic, never internal detail.
    pub fn message(self) -> &'static str {
        match self {
            ErrorCode::NotDefined => "server error",
            ErrorCode::FileNotFound => "file not found",
            ErrorCode::AccessViolation => "access violation",
            ErrorCode::IllegalOperation => "read-only server",
            ErrorCode::OptionRefused => "options refused",
        }
    }
}

/// Transfer modes, RFC 1350 section 5. Both are served byte for byte: boot files are binaries and
/// every boot client asks for octet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `octet`.
    Octet,
    /// `netascii`.
    Netascii,
}

/// Options of a request (RFC 2347), each kept only when its value is valid.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// blksize, 8-65464 (RFC 2348).
    pub blksize: Option<u16>,
    /// timeout in seconds, 1-255 (RFC 2349).
    pub timeout: Option<u8>,
    /// tsize (RFC 2349): 0 in a read request, asking for the size.
    pub tsize: Option<u64>,
    /// windowsize, 1-65535 (RFC 7440).
    pub windowsize: Option<u16>,
}

/// A request on the server's port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// RRQ.
    Read {
        /// The requested file name, as sent.
        filename: String,
        /// Transfer mode.
        mode: Mode,
        /// Requested options.
        options: Options,
    },
    /// WRQ (refused: the server is read-only).
    Write {
        /// The file name the client wanted to write.
        filename: String,
    },
}

/// What a client sends during a transfer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// ACK of a block number.
    Ack(u16),
    /// ERROR: the client gives up (code 8: it refuses the OACK).
    Error(u16),
    /// Anything else (ignored).
    Other,
}

fn opcode(buf: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes([*buf.first()?, *buf.get(1)?]))
}

/// Decode a request: opcode, file name, mode and option pairs, each NUL-terminated (RFC 1350
/// section 5, RFC 2347). `None` for anything that is not a well-formed RRQ or WRQ.
pub fn parse_request(buf: &[u8]) -> Option<Request> {
    let op = opcode(buf)?;
    if op != OP_RRQ && op != OP_WRQ {
        return None;
    }
    let body = buf.get(2..)?;
    // Every field ends with a NUL: split, and drop what follows the last NUL.
    let end = body.iter().rposition(|&b| b == 0)?;
    let mut fields = body[..end].split(|&b| b == 0);
    let filename = std::str::from_utf8(fields.next()?).ok()?.to_string();
    let mode = std::str::from_utf8(fields.next()?).ok()?;
    if filename.is_empty() {
        return None;
    }
    let mode = if mode.eq_ignore_ascii_case("octet") {
        Mode::Octet
    } else if mode.eq_ignore_ascii_case("netascii") {
        Mode::Netascii
    } else {
        return None; // "mail" (obsolete) or garbage
    };
    if op == OP_WRQ {
        return Some(Request::Write { filename });
    }
    let mut options = Options::default();
    // Option names are case-insensitive; unknown options and invalid values are ignored, which
    // RFC 2347 allows (the OACK names only what is granted).
    while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
        let (Ok(name), Ok(value)) = (std::str::from_utf8(name), std::str::from_utf8(value)) else {
            continue;
        };
        let name = name.to_ascii_lowercase();
        match name.as_str() {
            "blksize" => {
                options.blksize = value.parse().ok().filter(|v| (8..=65464).contains(v));
            }
            "timeout" => options.timeout = value.parse().ok().filter(|&v| v >= 1),
            "tsize" => options.tsize = value.parse().ok(),
            "windowsize" => options.windowsize = value.parse().ok().filter(|&v| v >= 1),
            _ => {}
        }
    }
    Some(Request::Read {
        filename,
        mode,
        options,
    })
}

/// Decode what a client sends during a transfer.
pub fn parse_reply(buf: &[u8]) -> Reply {
    match (opcode(buf), buf.get(2..4)) {
        (Some(OP_ACK), Some(b)) => Reply::Ack(u16::from_be_bytes([b[0], b[1]])),
        (Some(OP_ERROR), Some(b)) => Reply::Error(u16::from_be_bytes([b[0], b[1]])),
        _ => Reply::Other,
    }
}

/// Write a DATA packet's header for `block` into `buf` (which it clears); the payload follows.
pub fn data_header(buf: &mut Vec<u8>, block: u16) {
    buf.clear();
    buf.extend_from_slice(&OP_DATA.to_be_bytes());
    buf.extend_from_slice(&block.to_be_bytes());
}

/// An ERROR packet.
pub fn error(code: ErrorCode) -> Vec<u8> {
    let mut p = Vec::with_capacity(32);
    p.extend_from_slice(&OP_ERROR.to_be_bytes());
    p.extend_from_slice(&(code as u16).to_be_bytes());
    p.extend_from_slice(code.message().as_bytes());
    p.push(0);
    p
}

/// An OACK packet granting `(name, value)` pairs (RFC 2347).
pub fn oack(granted: &[(&str, String)]) -> Vec<u8> {
    let mut p = Vec::with_capacity(64);
    p.extend_from_slice(&OP_OACK.to_be_bytes());
    for (name, value) in granted {
        p.extend_from_slice(name.as_bytes());
        p.push(0);
        p.extend_from_slice(value.as_bytes());
        p.push(0);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rq(op: u16, fields: &[&str]) -> Vec<u8> {
        let mut p = op.to_be_bytes().to_vec();
        for f in fields {
            p.extend_from_slice(f.as_bytes());
            p.push(0);
        }
        p
    }

    #[test]
    fn requests_and_their_options() {
        let r = parse_request(&rq(
            1,
            &[
                "ipxe.efi",
                "OCTET",
                "blksize",
                "1468",
                "TSize",
                "0",
                "windowsize",
                "16",
                "timeout",
                "5",
                "multicast",
                "",
            ],
        ));
        assert_eq!(
            r,
            Some(Request::Read {
                filename: "ipxe.efi".into(),
                mode: Mode::Octet,
                options: Options {
                    blksize: Some(1468),
                    timeout: Some(5),
                    tsize: Some(0),
                    windowsize: Some(16),
                },
            })
        );
        // Invalid values are ignored, not fatal.
        let r = parse_request(&rq(
            1,
            &[
                "a",
                "netascii",
                "blksize",
                "7",
                "timeout",
                "0",
                "windowsize",
                "0",
                "tsize",
                "x",
            ],
        ));
        assert_eq!(
            r,
            Some(Request::Read {
                filename: "a".into(),
                mode: Mode::Netascii,
                options: Options::default(),
            })
        );
        assert_eq!(
            parse_request(&rq(2, &["up", "octet"])),
            Some(Request::Write {
                filename: "up".into()
            })
        );
        for bad in [
            rq(1, &["", "octet"]),
            rq(1, &["a", "mail"]),
            rq(3, &["a", "octet"]),
            b"\x00\x01a\x00octet".to_vec(), // no NUL after the mode
            vec![0],
            vec![],
        ] {
            assert_eq!(parse_request(&bad), None, "{bad:?}");
        }
    }

    #[test]
    fn packets() {
        assert_eq!(parse_reply(&[0, 4, 1, 2]), Reply::Ack(258));
        assert_eq!(parse_reply(&[0, 5, 0, 8, b'x', 0]), Reply::Error(8));
        assert_eq!(parse_reply(&[0, 4, 1]), Reply::Other);
        assert_eq!(parse_reply(&[0, 3, 0, 1]), Reply::Other);
        let mut b = vec![9; 10];
        data_header(&mut b, 65535);
        assert_eq!(b, [0, 3, 255, 255]);
        assert_eq!(
            error(ErrorCode::AccessViolation),
            b"\x00\x05\x00\x02access violation\x00"
        );
        assert_eq!(
            oack(&[("blksize", "1468".into()), ("windowsize", "16".into())]),
            b"\x00\x06blksize\x001468\x00windowsize\x0016\x00"
        );
    }
}
