//! A file range sent to a nonblocking tokio socket with `sendfile(2)`: the kernel moves page-cache
//! pages to the socket, with no copy through user space. Safe through `rustix` (no `unsafe` here).

use std::io;
use std::time::Duration;

use tokio::io::Interest;
use tokio::net::TcpStream;

/// Most bytes asked of one `sendfile` call. A call that misses the page cache reads the disk on
/// the calling thread; bounding it bounds that wait (nginx's `sendfile_max_chunk` default).
const MAX_CALL: u64 = 2 * 1024 * 1024;

/// Why a body was not sent whole.
#[derive(Debug, thiserror::Error)]
pub(super) enum SendError {
    /// The file ended before the range did: it shrank while being served.
    #[error("the file shrank while it was being served")]
    Shrank,
    /// The socket took nothing for the stall limit.
    #[error("the client took no data for {0:?}")]
    Stalled(Duration),
    /// The socket or the file failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Send `len` bytes of `file` from `start` to `stream`, waiting at most `stall` for the socket to
/// take more each time it is full. Short writes and `EAGAIN` are resumed where they stopped.
pub(super) async fn send_range(
    stream: &TcpStream,
    file: &std::fs::File,
    start: u64,
    len: u64,
    stall: Duration,
) -> Result<(), SendError> {
    let mut offset = start;
    let end = start + len;
    while offset < end {
        // usize: at most MAX_CALL.
        let want = (end - offset).min(MAX_CALL) as usize;
        tokio::time::timeout(stall, stream.writable())
            .await
            .map_err(|_| SendError::Stalled(stall))??;
        let sent = stream.try_io(Interest::WRITABLE, || {
            rustix::fs::sendfile(stream, file, Some(&mut offset), want).map_err(io::Error::from)
        });
        match sent {
            Ok(0) => return Err(SendError::Shrank),
            Ok(_) => {} // the kernel advanced `offset`
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(SendError::Io(e)),
        }
    }
    Ok(())
}
