//! DHCPv4 wire format (RFC 2131 section 2, options RFC 2132) through `dhcproto`: bytes to a checked
//! `DhcpRequest`, and a `DhcpReply` to bytes. Every refusal is a named drop reason, never a panic.

use std::net::Ipv4Addr;

use dhcproto::v4::{self, DhcpOption, MessageType, Opcode, OptionCode};
use dhcproto::{Decodable, Decoder, Encodable, Encoder};

use crate::domain::dhcp::classify;
use crate::domain::MacAddr;
use crate::service::provisioning::dhcp::{DhcpReply, DhcpRequest, ReplyKind, RequestKind};

/// Largest hop count a relayed request may carry (RFC 1542 section 4.1.1 suggests 4 as a default
/// limit; 16 is the maximum any relay may be configured with).
const MAX_HOPS: u8 = 16;

/// Smallest BOOTP/DHCP message: the fixed header (236 bytes) plus the magic cookie.
const MIN_LEN: usize = 240;

/// Decode and check a request. `Err` is the drop reason.
pub fn decode(
    buf: &[u8],
    proxy_port: bool,
    local_ips: &[Ipv4Addr],
) -> Result<(v4::Message, DhcpRequest), &'static str> {
    if buf.len() < MIN_LEN {
        return Err("truncated");
    }
    // dhcproto asserts (in debug builds) that option 94 has length 3; check it ourselves first so a
    // malformed option 94 is a drop, not a panic.
    if !options_well_formed(&buf[MIN_LEN..]) {
        return Err("bad_option_length");
    }
    // Option 52 (RFC 2132 section 9.3) moves more options into `file` (1), `sname` (2) or both (3);
    // dhcproto decodes those too, so check them as well.
    if let Some(overload) = option_value(&buf[MIN_LEN..], 52).and_then(|v| v.first().copied()) {
        let file_ok = overload & 1 == 0 || options_well_formed(&buf[108..236]);
        let sname_ok = overload & 2 == 0 || options_well_formed(&buf[44..108]);
        if !(file_ok && sname_ok) {
            return Err("bad_option_length");
        }
    }
    let msg = v4::Message::decode(&mut Decoder::new(buf)).map_err(|_| "malformed")?;
    if msg.opcode() != Opcode::BootRequest {
        return Err("not_a_request");
    }
    if msg.htype() != v4::HType::Eth || msg.hlen() != 6 || msg.chaddr().len() < 6 {
        return Err("not_ethernet");
    }
    if msg.hops() > MAX_HOPS {
        return Err("too_many_hops");
    }
    let kind = match msg.opts().msg_type() {
        None => return Err("bootp_unsupported"),
        Some(MessageType::Discover) => RequestKind::Discover,
        Some(MessageType::Request) => RequestKind::Request,
        Some(MessageType::Decline) => RequestKind::Decline,
        Some(MessageType::Release) => RequestKind::Release,
        Some(MessageType::Inform) => RequestKind::Inform,
        Some(_) => return Err("unexpected_message_type"),
    };
    let mut mac = [0u8; 6];
    mac.copy_from_slice(&msg.chaddr()[..6]);
    let opts = msg.opts();
    let arch = match opts.get(OptionCode::ClientSystemArchitecture) {
        Some(DhcpOption::ClientSystemArchitecture(a)) => Some(u16::from(*a)),
        _ => None,
    };
    let vendor = match opts.get(OptionCode::ClassIdentifier) {
        Some(DhcpOption::ClassIdentifier(v)) => Some(v.as_slice()),
        _ => None,
    };
    let user = match opts.get(OptionCode::UserClass) {
        Some(DhcpOption::UserClass(v)) => Some(v.as_slice()),
        _ => None,
    };
    let client = classify(arch, vendor, user);
    let requested_ip = match opts.get(OptionCode::RequestedIpAddress) {
        Some(DhcpOption::RequestedIpAddress(ip)) => Some(*ip),
        _ => None,
    };
    let server_id = match opts.get(OptionCode::ServerIdentifier) {
        Some(DhcpOption::ServerIdentifier(ip)) => Some(*ip),
        _ => None,
    };
    let hostname = match opts.get(OptionCode::Hostname) {
        Some(DhcpOption::Hostname(h)) => {
            Some(h.chars().filter(|c| !c.is_control()).take(255).collect())
        }
        _ => None,
    };
    let (mut circuit_id, mut remote_id) = (None, None);
    if let Some(DhcpOption::RelayAgentInformation(info)) =
        opts.get(OptionCode::RelayAgentInformation)
    {
        use dhcproto::v4::relay::{RelayCode, RelayInfo};
        if let Some(RelayInfo::AgentCircuitId(c)) = info.get(RelayCode::AgentCircuitId) {
            circuit_id = Some(c.clone());
        }
        if let Some(RelayInfo::AgentRemoteId(r)) = info.get(RelayCode::AgentRemoteId) {
            remote_id = Some(r.clone());
        }
    }
    let req = DhcpRequest {
        kind,
        mac: MacAddr(mac),
        ciaddr: msg.ciaddr(),
        giaddr: msg.giaddr(),
        requested_ip,
        server_id,
        client,
        hostname,
        circuit_id,
        remote_id,
        proxy_port,
        local_ips: local_ips.to_vec(),
        interface: None,
        source: Ipv4Addr::UNSPECIFIED,
        known: false,
    };
    Ok((msg, req))
}

/// The value of the first occurrence of option `code` in an options area.
fn option_value(opts: &[u8], code: u8) -> Option<&[u8]> {
    let mut i = 0;
    while i < opts.len() {
        match opts[i] {
            0 => i += 1,
            255 => return None,
            c => {
                let len = usize::from(*opts.get(i + 1)?);
                let v = opts.get(i + 2..i + 2 + len)?;
                if c == code {
                    return Some(v);
                }
                i += 2 + len;
            }
        }
    }
    None
}

/// Walk an options area: every option's length must fit, and the options dhcproto reads with a
/// fixed length must have it. dhcproto concatenates a run of adjacent instances of one option
/// (RFC 3396) and decodes each run on its own (a pad or another option ends a run), so lengths
/// are summed and checked per run: a short instance apart from the others is read alone.
fn options_well_formed(opts: &[u8]) -> bool {
    // (code, summed length) of the current run.
    let mut run: Option<(u8, usize)> = None;
    let mut i = 0;
    while i < opts.len() {
        let code = opts[i];
        if code == 0 || code == 255 {
            if run.take().is_some_and(|(c, len)| !length_ok(c, len)) {
                return false;
            }
            if code == 255 {
                break;
            }
            i += 1;
            continue;
        }
        let Some(&len) = opts.get(i + 1) else {
            return false;
        };
        let len = usize::from(len);
        if i + 2 + len > opts.len() {
            return false;
        }
        match &mut run {
            Some((c, total)) if *c == code => *total += len,
            _ => {
                if run
                    .replace((code, len))
                    .is_some_and(|(c, l)| !length_ok(c, l))
                {
                    return false;
                }
            }
        }
        i += 2 + len;
    }
    run.is_none_or(|(c, len)| length_ok(c, len))
}

/// Is `len` a length dhcproto reads option `code` with, without asserting?
fn length_ok(code: u8, len: usize) -> bool {
    // Fixed lengths (RFC 2132, 4039, 4578, 6926): among them every option dhcproto reads with a
    // `debug_assert!` on its length (80, 94, 152-155), which a fuzz build turns into a panic.
    let fixed = match code {
        80 => Some(0),
        52 | 53 | 156 | 157 => Some(1),
        57 => Some(2),
        94 => Some(3),
        51 | 58 | 59 | 152..=155 => Some(4),
        _ => None,
    };
    let too_short = match code {
        93 => len < 2 || len % 2 != 0, // a list of u16
        81 => len < 3,                 // client FQDN: flags, rcode1, rcode2, name
        151 => len < 1,                // bulk lease query status code
        _ => false,
    };
    fixed.is_none_or(|f| f == len) && !too_short
}

/// Encode the answer to `req` (the request message, whose xid, flags, giaddr, chaddr and option
/// 82 are echoed).
pub fn encode(req: &v4::Message, reply: &DhcpReply) -> Option<Vec<u8>> {
    let mut m = v4::Message::default();
    m.set_opcode(Opcode::BootReply)
        .set_htype(v4::HType::Eth)
        .set_xid(req.xid())
        .set_flags(req.flags())
        .set_giaddr(req.giaddr())
        .set_chaddr(req.chaddr())
        .set_yiaddr(reply.yiaddr);
    if reply.kind != ReplyKind::Nak && !req.ciaddr().is_unspecified() {
        m.set_ciaddr(req.ciaddr());
    }
    let o = m.opts_mut();
    o.insert(DhcpOption::MessageType(match reply.kind {
        ReplyKind::Offer => MessageType::Offer,
        ReplyKind::Ack => MessageType::Ack,
        ReplyKind::Nak => MessageType::Nak,
    }));
    o.insert(DhcpOption::ServerIdentifier(reply.server_ip));
    if let Some(msg) = &reply.message {
        o.insert(DhcpOption::Message(msg.clone())); // option 56
    }
    if let Some(s) = &reply.subnet {
        if !reply.pxe_vendor {
            o.insert(DhcpOption::SubnetMask(s.net.netmask())); // option 1
            if !s.routers.is_empty() {
                o.insert(DhcpOption::Router(s.routers.clone())); // option 3
            }
            if !s.dns.is_empty() {
                o.insert(DhcpOption::DomainNameServer(s.dns.clone())); // option 6
            }
            if let Some(d) = &s.domain {
                o.insert(DhcpOption::DomainName(d.clone())); // option 15
            }
            if !s.ntp.is_empty() {
                o.insert(DhcpOption::NtpServers(s.ntp.clone())); // option 42
            }
        }
    }
    if let Some(secs) = reply.lease_seconds {
        o.insert(DhcpOption::AddressLeaseTime(secs)); // option 51
        o.insert(DhcpOption::Renewal(secs / 2)); // option 58, T1 = 0.5 (RFC 2131 section 4.4.5)
        o.insert(DhcpOption::Rebinding(secs / 8 * 7)); // option 59, T2 = 0.875
    }
    if let Some(b) = &reply.boot {
        if b.http_client {
            o.insert(DhcpOption::ClassIdentifier(b"HTTPClient".to_vec())); // option 60 echo, UEFI HTTP boot
        } else if reply.pxe_vendor {
            o.insert(DhcpOption::ClassIdentifier(b"PXEClient".to_vec())); // option 60, PXE spec
        }
        o.insert(DhcpOption::BootfileName(b.file.clone().into_bytes())); // option 67
        if !b.file.starts_with("http") {
            o.insert(DhcpOption::TFTPServerName(
                reply.server_ip.to_string().into_bytes(),
            )); // option 66
        }
        if reply.no_pxedhcp {
            // iPXE encapsulated options (175), sub-option 176 no-pxedhcp = 1.
            o.insert(DhcpOption::Unknown(v4::UnknownOption::new(
                OptionCode::from(175),
                vec![176, 1, 1],
            )));
        }
    }
    if let Some(opt) = req.opts().get(OptionCode::RelayAgentInformation) {
        o.insert(opt.clone()); // option 82 echoed (RFC 3046 section 2.2)
    }
    if let Some(b) = &reply.boot {
        if b.file.len() < 128 {
            m.set_fname_str(&b.file);
        }
        m.set_siaddr(reply.server_ip);
    }
    let mut out = Vec::with_capacity(576);
    m.encode(&mut Encoder::new(&mut out)).ok()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn discover(extra: &[DhcpOption]) -> Vec<u8> {
        let mut m = v4::Message::new(
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            &[0x52, 0x54, 0, 1, 2, 3],
        );
        m.opts_mut()
            .insert(DhcpOption::MessageType(MessageType::Discover));
        for o in extra {
            m.opts_mut().insert(o.clone());
        }
        let mut out = Vec::new();
        m.encode(&mut Encoder::new(&mut out)).expect("encode");
        out
    }

    #[test]
    fn decodes_a_pxe_discover() {
        let buf = discover(&[
            DhcpOption::ClientSystemArchitecture(7.into()),
            DhcpOption::ClassIdentifier(b"PXEClient:Arch:00007".to_vec()),
        ]);
        let (_, req) = decode(&buf, false, &[]).expect("decodes");
        assert_eq!(req.kind, RequestKind::Discover);
        assert_eq!(req.mac.to_string(), "52:54:00:01:02:03");
        assert_eq!(
            req.client,
            crate::domain::dhcp::BootClient::UefiPxe(crate::domain::dhcp::Arch::Amd64)
        );
    }

    #[test]
    fn refuses_bad_input_without_panicking() {
        let good = discover(&[]);
        assert_eq!(decode(&good[..100], false, &[]).err(), Some("truncated"));
        let mut no_type = good.clone();
        // Replace option 53 with a pad: a BOOTP request.
        let pos = no_type[240..].iter().position(|b| *b == 53).expect("53") + 240;
        no_type[pos] = 0;
        no_type[pos + 1] = 0;
        no_type[pos + 2] = 0;
        assert_eq!(
            decode(&no_type, false, &[]).err(),
            Some("bootp_unsupported")
        );
        let mut hops = good.clone();
        hops[3] = 200;
        assert_eq!(decode(&hops, false, &[]).err(), Some("too_many_hops"));
        let mut bad94 = good[..good.len() - 1].to_vec();
        bad94.extend_from_slice(&[94, 1, 1, 255]);
        assert_eq!(decode(&bad94, false, &[]).err(), Some("bad_option_length"));
        // Found by the fuzz target: option 153 (and its kin) with the wrong length.
        for code in [80u8, 152, 153, 154, 155, 156, 81] {
            let mut bad = good[..good.len() - 1].to_vec();
            bad.extend_from_slice(&[code, 2, 1, 1, 255]);
            assert_eq!(
                decode(&bad, false, &[]).err(),
                Some("bad_option_length"),
                "option {code}"
            );
        }
        // And in the `file` field when option 52 says options overflow there.
        let mut overloaded = good[..good.len() - 1].to_vec();
        overloaded.extend_from_slice(&[52, 1, 1, 255]);
        overloaded[108..113].copy_from_slice(&[154, 1, 0, 255, 0]);
        assert_eq!(
            decode(&overloaded, false, &[]).err(),
            Some("bad_option_length"),
            "overloaded file field"
        );
        // Two instances of one fixed-length option, each well-formed alone, concatenate (RFC 3396)
        // into a wrong length.
        let mut split = good[..good.len() - 1].to_vec();
        split.extend_from_slice(&[154, 4, 0, 0, 0, 1, 154, 4, 0, 0, 0, 2, 255]);
        assert_eq!(
            decode(&split, false, &[]).err(),
            Some("bad_option_length"),
            "concatenated option"
        );
        // Found by the fuzz target: a short option 81 apart from longer ones (a pad between) is
        // decoded alone, so the lengths of separate runs must not be summed.
        let mut apart = good[..good.len() - 1].to_vec();
        apart.extend_from_slice(&[81, 3, 0, 0, 0, 0, 81, 0, 255]);
        assert_eq!(
            decode(&apart, false, &[]).err(),
            Some("bad_option_length"),
            "short option 81 apart"
        );
        let crash = include_bytes!(
            "../../fuzz/regressions/dhcp_decode_decide/crash-2023b31a7784bc7f045c82f06173064eeaeae7ad"
        );
        assert_eq!(
            decode(crash, false, &[]).err(),
            Some("bad_option_length"),
            "the fuzz target's input"
        );
        // Adjacent instances still concatenate into one valid option.
        let mut joined = good[..good.len() - 1].to_vec();
        joined.extend_from_slice(&[81, 1, 0, 81, 2, 0, 0, 255]);
        assert!(
            decode(&joined, false, &[]).is_ok(),
            "option 81 split in two"
        );
        let mut overlong = good[..good.len() - 1].to_vec();
        overlong.extend_from_slice(&[12, 200, b'x']);
        assert_eq!(
            decode(&overlong, false, &[]).err(),
            Some("bad_option_length")
        );
        let mut reply = good.clone();
        reply[0] = 2;
        assert_eq!(decode(&reply, false, &[]).err(), Some("not_a_request"));
    }

    /// What UEFI HTTP boot firmware reads from an answer (EDK2 HttpBootDxe): option 60
    /// `HTTPClient` (an offer without it is not an HTTP boot offer), the URL in option 67 and, when
    /// it fits in 128 bytes, in the `file` field too; no TFTP server name (option 66).
    #[test]
    fn http_boot_answer_on_the_wire() {
        let req_bytes = discover(&[
            DhcpOption::ClientSystemArchitecture(16.into()),
            DhcpOption::ClassIdentifier(b"HTTPClient:Arch:00016:UNDI:003001".to_vec()),
        ]);
        let req = v4::Message::decode(&mut Decoder::new(&req_bytes)).expect("request");
        let answer = |file: &str| {
            let reply = DhcpReply {
                kind: ReplyKind::Offer,
                yiaddr: Ipv4Addr::new(10, 0, 0, 100),
                server_ip: Ipv4Addr::new(10, 0, 0, 1),
                subnet: None,
                lease_seconds: Some(600),
                boot: Some(crate::domain::dhcp::BootAnswer {
                    file: file.to_string(),
                    http_client: true,
                }),
                pxe_vendor: false,
                no_pxedhcp: false,
                message: None,
                committed: None,
            };
            let out = encode(&req, &reply).expect("encodes");
            v4::Message::decode(&mut Decoder::new(&out)).expect("decodes")
        };
        let url = "http://10.0.0.1:8080/ipxe/ipxe.efi";
        let m = answer(url);
        assert_eq!(
            m.opts().get(OptionCode::ClassIdentifier),
            Some(&DhcpOption::ClassIdentifier(b"HTTPClient".to_vec()))
        );
        assert_eq!(
            m.opts().get(OptionCode::BootfileName),
            Some(&DhcpOption::BootfileName(url.as_bytes().to_vec()))
        );
        // The `file` field: the URL, NUL-terminated (RFC 2131 section 2).
        let file = m.fname().unwrap_or_default();
        assert_eq!(file.split(|b| *b == 0).next(), Some(url.as_bytes()));
        assert!(m.opts().get(OptionCode::TFTPServerName).is_none());
        // A URL too long for the 128-byte `file` field goes in option 67 only.
        let long = format!("http://plinth.example:8080/{}/ipxe.efi", "a".repeat(120));
        let m = answer(&long);
        assert_eq!(
            m.opts().get(OptionCode::BootfileName),
            Some(&DhcpOption::BootfileName(long.as_bytes().to_vec()))
        );
        assert!(m.fname().unwrap_or_default().iter().all(|b| *b == 0));
    }
}
