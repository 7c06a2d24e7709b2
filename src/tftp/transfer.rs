//! One read transfer on its own socket (the server's transfer identifier, RFC 1350 section 4):
//! option negotiation answered with an OACK (RFC 2347), blocks of the negotiated blksize
//! (RFC 2348), tsize and timeout (RFC 2349), and windows of blocks acknowledged together
//! (RFC 7440). A window not acknowledged within the timeout is sent again from the first block the
//! client has not acknowledged; duplicate or stale ACKs are ignored (no Sorcerer's Apprentice
//! retransmissions).

use std::sync::Arc;
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::time::Instant;

use super::wire::{self, Options, Reply};

/// RFC 1350's block size, when the client does not negotiate one.
const DEFAULT_BLKSIZE: u16 = 512;
/// Retransmission timeout when the client does not negotiate one.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);
/// Times a window (or the OACK) is sent again before the transfer is abandoned, at most.
pub const MAX_RETRIES: u32 = 10;
/// Longest retransmission timeout granted (RFC 2349 allows a client to ask up to 255 s; a silent
/// client would pin a transfer, its socket and its descriptor for 47 minutes).
pub const MAX_TIMEOUT: u8 = 10;
/// Time a transfer waits for a client that stopped answering, in all its retransmissions: the
/// number of retries is this over the timeout (10 at the default 3 s, 3 at 10 s).
pub const RETRY_BUDGET: Duration = Duration::from_secs(30);

/// The bytes served.
#[derive(Clone, Debug)]
pub enum Source {
    /// A small file, held in memory and shared between transfers.
    Shared(Arc<[u8]>),
    /// A larger file, read a window at a time on the blocking pool.
    File(Arc<std::fs::File>, u64),
}

impl Source {
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        match self {
            Source::Shared(b) => b.len() as u64,
            Source::File(_, len) => *len,
        }
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `len` bytes from `offset` (fewer at the end of the file).
    async fn read(&self, offset: u64, len: usize) -> std::io::Result<Window> {
        match self {
            Source::Shared(b) => {
                let start = usize::try_from(offset).unwrap_or(usize::MAX).min(b.len());
                let end = start.saturating_add(len).min(b.len());
                Ok(Window {
                    bytes: b.clone(),
                    start,
                    end,
                })
            }
            Source::File(f, size) => {
                let f = f.clone();
                let n = usize::try_from(size.saturating_sub(offset))
                    .unwrap_or(usize::MAX)
                    .min(len);
                let bytes = tokio::task::spawn_blocking(move || {
                    use std::os::unix::fs::FileExt;
                    let mut buf = vec![0u8; n];
                    f.read_exact_at(&mut buf, offset)?;
                    Ok::<_, std::io::Error>(buf)
                })
                .await
                .map_err(std::io::Error::other)??;
                Ok(Window {
                    end: bytes.len(),
                    bytes: bytes.into(),
                    start: 0,
                })
            }
        }
    }
}

/// The bytes of the blocks of one window.
struct Window {
    bytes: Arc<[u8]>,
    start: usize,
    end: usize,
}

/// Limits the server grants at most.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest blksize granted.
    pub max_block_size: u16,
    /// Largest windowsize granted.
    pub max_window_size: u16,
}

/// The parameters of one transfer, after negotiation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Negotiated {
    /// Bytes per DATA block.
    pub blksize: u16,
    /// Blocks sent before waiting for an ACK.
    pub windowsize: u16,
    /// Retransmission timeout.
    pub timeout: Duration,
    /// Retransmissions of one window (or the OACK) before the transfer is abandoned.
    pub retries: u32,
    /// The OACK to send first, when the client asked for options the server grants.
    pub oack: Option<Vec<u8>>,
}

/// Grant what the client asked within the server's limits (RFC 2347: the OACK names only the
/// granted options; a client asking more than the limit gets the limit, RFC 2348 and RFC 7440).
pub fn negotiate(asked: &Options, limits: Limits, size: u64) -> Negotiated {
    let mut granted: Vec<(&str, String)> = Vec::new();
    let blksize = match asked.blksize {
        Some(b) => {
            let b = b.min(limits.max_block_size).max(8);
            granted.push(("blksize", b.to_string()));
            b
        }
        None => DEFAULT_BLKSIZE,
    };
    // RFC 2349: the server grants the timeout the client asked, or leaves the option out of the
    // OACK (it cannot answer another value); one past `MAX_TIMEOUT` is left out.
    let timeout = match asked.timeout {
        Some(t) if (1..=MAX_TIMEOUT).contains(&t) => {
            granted.push(("timeout", t.to_string()));
            Duration::from_secs(u64::from(t))
        }
        _ => DEFAULT_TIMEOUT,
    };
    let retries = u32::try_from(RETRY_BUDGET.as_secs() / timeout.as_secs().max(1))
        .unwrap_or(MAX_RETRIES)
        .clamp(1, MAX_RETRIES);
    if asked.tsize.is_some() {
        granted.push(("tsize", size.to_string()));
    }
    let windowsize = match asked.windowsize {
        Some(w) => {
            let w = w.min(limits.max_window_size).max(1);
            granted.push(("windowsize", w.to_string()));
            w
        }
        None => 1,
    };
    Negotiated {
        blksize,
        windowsize,
        timeout,
        retries,
        oack: (!granted.is_empty()).then(|| wire::oack(&granted)),
    }
}

/// Why a transfer ended early.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// The client stopped answering.
    #[error("no ACK after {0} retransmissions")]
    TimedOut(u32),
    /// The client sent an ERROR packet (code 8: it refused the OACK).
    #[error("the client aborted with TFTP error {0}")]
    Aborted(u16),
    /// A socket or file error (including ICMP port unreachable: the client is gone).
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// A transfer's one retransmission timer. Arming it per window only moves a deadline; the
/// timer under it is reset when it fires early (at most once per timeout), not for every block:
/// a lock-step transfer arms it for each of its blocks, and registering a timer with the runtime
/// for each was a lock and a wheel update per block.
struct Retransmit {
    sleep: std::pin::Pin<Box<tokio::time::Sleep>>,
    deadline: Instant,
}

impl Retransmit {
    fn new(timeout: Duration) -> Self {
        let deadline = Instant::now() + timeout;
        Retransmit {
            sleep: Box::pin(tokio::time::sleep_until(deadline)),
            deadline,
        }
    }

    /// The window (or OACK) just sent is retransmitted after `timeout` without an ACK.
    fn arm(&mut self, timeout: Duration) {
        self.deadline = Instant::now() + timeout;
    }

    /// Ready once the armed deadline has passed.
    async fn expired(&mut self) {
        loop {
            self.sleep.as_mut().await;
            if Instant::now() >= self.deadline {
                return;
            }
            self.sleep.as_mut().reset(self.deadline);
        }
    }
}

/// Wait for an ACK until the timer's deadline: `Ok(Some(block))`, `Ok(None)` at the deadline.
async fn ack(socket: &UdpSocket, timer: &mut Retransmit) -> Result<Option<u16>, TransferError> {
    let mut buf = [0u8; 516];
    loop {
        let n = tokio::select! {
            biased;
            r = socket.recv(&mut buf) => r?,
            () = timer.expired() => return Ok(None),
        };
        match wire::parse_reply(&buf[..n]) {
            Reply::Ack(b) => return Ok(Some(b)),
            Reply::Error(code) => return Err(TransferError::Aborted(code)),
            Reply::Other => {}
        }
    }
}

/// Serve `source` on `socket` (bound and connected to the client) with `neg`. Returns the bytes
/// the client acknowledged.
pub async fn send(
    socket: &UdpSocket,
    source: &Source,
    neg: &Negotiated,
) -> Result<u64, TransferError> {
    let mut timer = Retransmit::new(neg.timeout);
    // The OACK waits for ACK 0 (RFC 2347), with retransmissions like a window.
    if let Some(oack) = &neg.oack {
        let mut tries = 0;
        loop {
            socket.send(oack).await?;
            timer.arm(neg.timeout);
            match ack(socket, &mut timer).await? {
                Some(0) => break,
                Some(_) => continue,
                None if tries < neg.retries => tries += 1,
                None => return Err(TransferError::TimedOut(tries)),
            }
        }
    }
    let blksize = u64::from(neg.blksize);
    // Blocks are numbered from 1; the last one is shorter than blksize (empty when the size is a
    // multiple of it). Block numbers wrap from 65535 to 0, as common clients expect.
    let last = source.len() / blksize + 1;
    let mut base: u64 = 1; // first block not acknowledged
    let mut packet = Vec::with_capacity(wire::DATA_HEADER + usize::from(neg.blksize));
    while base <= last {
        let end = (base + u64::from(neg.windowsize)).min(last + 1); // window: [base, end)
        let window = source
            .read(
                (base - 1) * blksize,
                usize::try_from((end - base) * blksize).unwrap_or(usize::MAX),
            )
            .await?;
        let mut tries = 0;
        'window: loop {
            for (i, block) in (base..end).enumerate() {
                let from = window.start + i * usize::from(neg.blksize);
                let to = (from + usize::from(neg.blksize)).min(window.end);
                wire::data_header(&mut packet, block as u16);
                packet.extend_from_slice(&window.bytes[from.min(to)..to]);
                socket.send(&packet).await?;
            }
            timer.arm(neg.timeout);
            loop {
                let Some(acked) = ack(socket, &mut timer).await? else {
                    if tries >= neg.retries {
                        return Err(TransferError::TimedOut(tries));
                    }
                    tries += 1;
                    continue 'window;
                };
                // How many blocks of this window the ACK covers (16-bit block arithmetic).
                let covered = u64::from(acked.wrapping_sub((base - 1) as u16));
                if covered >= 1 && covered <= end - base {
                    base += covered;
                    break 'window;
                }
                // A duplicate or stale ACK: wait on.
            }
        }
    }
    Ok(source.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_block_size: 1468,
        max_window_size: 16,
    };

    #[test]
    fn negotiation_grants_within_limits() {
        let n = negotiate(&Options::default(), LIMITS, 10);
        assert_eq!(
            n,
            Negotiated {
                blksize: 512,
                windowsize: 1,
                timeout: DEFAULT_TIMEOUT,
                retries: MAX_RETRIES,
                oack: None
            }
        );
        let n = negotiate(
            &Options {
                blksize: Some(8192),
                timeout: Some(2),
                tsize: Some(0),
                windowsize: Some(64),
            },
            LIMITS,
            1000,
        );
        assert_eq!((n.blksize, n.windowsize), (1468, 16));
        assert_eq!(n.timeout, Duration::from_secs(2));
        assert_eq!(n.retries, MAX_RETRIES);
        assert_eq!(
            n.oack.as_deref(),
            Some(&b"\x00\x06blksize\x001468\x00timeout\x002\x00tsize\x001000\x00windowsize\x0016\x00"[..])
        );
    }

    #[test]
    fn a_long_timeout_is_not_granted_and_retries_fit_the_budget() {
        for asked in [0u8, 11, 60, 255] {
            let n = negotiate(
                &Options {
                    timeout: Some(asked),
                    ..Default::default()
                },
                LIMITS,
                10,
            );
            assert_eq!(n.timeout, DEFAULT_TIMEOUT, "timeout={asked}");
            assert_eq!(n.oack, None, "timeout={asked} is left out of the OACK");
        }
        let n = negotiate(
            &Options {
                timeout: Some(MAX_TIMEOUT),
                ..Default::default()
            },
            LIMITS,
            10,
        );
        assert_eq!(n.timeout, Duration::from_secs(u64::from(MAX_TIMEOUT)));
        assert_eq!(n.retries, 3);
        assert!(n.timeout * (n.retries + 1) <= RETRY_BUDGET + n.timeout);
    }

    /// A client on a real socket: acknowledges every `ack_every` blocks (and the last), drops the
    /// first window's packets once to force a retransmission, and checks the bytes.
    async fn client(source: Source, options: Options, drop_first_window: bool) -> (Vec<u8>, usize) {
        let server = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
        let client = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
        server
            .connect(client.local_addr().expect("addr"))
            .await
            .expect("connect");
        client
            .connect(server.local_addr().expect("addr"))
            .await
            .expect("connect");
        let neg = negotiate(&options, LIMITS, source.len());
        let neg = Negotiated {
            timeout: Duration::from_millis(200),
            ..neg
        };
        let (blk, win) = (usize::from(neg.blksize), u64::from(neg.windowsize));
        let has_oack = neg.oack.is_some();
        let srv = tokio::spawn(async move { send(&server, &source, &neg).await });
        let mut got = Vec::new();
        let mut buf = vec![0u8; 70000];
        let mut expected: u16 = 1;
        let mut packets = 0;
        let mut dropped = !drop_first_window;
        if has_oack {
            let n = client.recv(&mut buf).await.expect("oack");
            assert_eq!(&buf[..2], &[0, 6], "{:?}", &buf[..n]);
            client.send(&[0, 4, 0, 0]).await.expect("ack 0");
        }
        let mut in_window = 0;
        loop {
            let n = client.recv(&mut buf).await.expect("data");
            packets += 1;
            assert_eq!(&buf[..2], &[0, 3]);
            let block = u16::from_be_bytes([buf[2], buf[3]]);
            if !dropped {
                in_window += 1;
                if in_window as u64 == win.min(3) {
                    dropped = true; // ignore the first window: the server resends it
                    in_window = 0;
                }
                continue;
            }
            if block != expected {
                continue; // a retransmitted block already kept
            }
            got.extend_from_slice(&buf[4..n]);
            expected = expected.wrapping_add(1);
            in_window += 1;
            let last = n - 4 < blk;
            if last || in_window as u64 % win == 0 {
                client.send(&[0, 4, buf[2], buf[3]]).await.expect("ack");
            }
            if last {
                break;
            }
        }
        assert!(srv.await.expect("join").is_ok());
        (got, packets)
    }

    #[tokio::test]
    async fn windows_and_retransmission_deliver_every_byte() {
        let data: Arc<[u8]> = (0..50_000u32).map(|i| (i * 31 % 251) as u8).collect();
        let shared = Source::Shared(data.clone());
        let (got, _) = client(shared.clone(), Options::default(), false).await;
        assert_eq!(&got[..], &data[..]);
        let opts = Options {
            blksize: Some(1468),
            windowsize: Some(16),
            tsize: Some(0),
            timeout: None,
        };
        let (got, _) = client(shared.clone(), opts.clone(), true).await;
        assert_eq!(&got[..], &data[..], "window of 16 after a lost window");
        // A size that is a multiple of blksize ends with an empty block; a file source.
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("f");
        std::fs::write(&p, &data[..1468 * 20]).expect("write");
        let f = Source::File(Arc::new(std::fs::File::open(&p).expect("open")), 1468 * 20);
        let (got, packets) = client(f, opts, false).await;
        assert_eq!(&got[..], &data[..1468 * 20]);
        assert_eq!(packets, 21, "20 full blocks and an empty one");
    }
}
