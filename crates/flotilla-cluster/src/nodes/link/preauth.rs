//! A connection accepted on a process's node listener, handed to
//! ractor_cluster with a budget on what it may send before it authenticates.
//!
//! ractor_cluster reads a frame whole, up to the frame limit (64 MiB here,
//! [`MAX_FRAME`](super::MAX_FRAME)), before anything looks at it, and that
//! holds before authentication too: without a budget, each connection waiting
//! to authenticate could make its process buffer 64 MiB, and
//! [`MAX_HANDSHAKES`](crate::nodes::handshake::MAX_HANDSHAKES) of them 4 GiB,
//! for any peer that can reach the listener, cookie or not. A handshake is a
//! few hundred bytes; past [`PRE_AUTH_BYTES`] the read fails and ractor_cluster
//! closes the session. Once the session authenticates
//! ([`Handshakes::done`](crate::nodes::handshake::Handshakes::done) opens the
//! gate) reads are whole again.

use std::{
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
};

use ractor_cluster::{BoxRead, BoxWrite, ClusterBidiStream};
use tokio::{
    io::{AsyncRead, ReadBuf},
    net::{TcpStream, tcp::OwnedReadHalf},
};

/// Bytes a connection may send before it authenticates: the handshake and
/// the peer's first process-group sync, which come before this side has
/// marked the session authenticated, are far under it.
pub(crate) const PRE_AUTH_BYTES: usize = 64 << 10;

/// An accepted connection whose reads are bounded by [`PRE_AUTH_BYTES`]
/// until `open` is set.
pub(crate) struct PreAuthStream {
    stream: TcpStream,
    peer: SocketAddr,
    local: SocketAddr,
    open: Arc<AtomicBool>,
}

impl PreAuthStream {
    /// `stream`, accepted from `peer` on `local`, gated by `open`.
    pub(crate) fn new(
        stream: TcpStream,
        peer: SocketAddr,
        local: SocketAddr,
        open: Arc<AtomicBool>,
    ) -> Self {
        PreAuthStream {
            stream,
            peer,
            local,
            open,
        }
    }
}

impl ClusterBidiStream for PreAuthStream {
    fn split(self: Box<Self>) -> (BoxRead, BoxWrite) {
        let (read, write) = self.stream.into_split();
        let read = PreAuthRead {
            inner: read,
            left: PRE_AUTH_BYTES,
            open: self.open,
        };
        (Box::new(read), Box::new(write))
    }

    /// The peer's address, as a [`NetworkStream::Raw`](ractor_cluster::NetworkStream)
    /// session would show it (the session's `peer_addr`).
    fn peer_label(&self) -> Option<String> {
        Some(self.peer.to_string())
    }

    fn local_label(&self) -> Option<String> {
        Some(self.local.to_string())
    }
}

/// The read half: at most `left` more bytes while `open` is unset.
struct PreAuthRead {
    inner: OwnedReadHalf,
    left: usize,
    open: Arc<AtomicBool>,
}

impl AsyncRead for PreAuthRead {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.open.load(Ordering::Acquire) {
            return Pin::new(&mut self.inner).poll_read(cx, buf);
        }
        if self.left == 0 {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("more than {PRE_AUTH_BYTES} bytes before authenticating"),
            )));
        }
        let room = buf.remaining().min(self.left);
        // Zeroed first (safe code only); at most the budget, and only before
        // authentication.
        let mut limited = ReadBuf::new(buf.initialize_unfilled_to(room));
        let ready = Pin::new(&mut self.inner).poll_read(cx, &mut limited);
        let n = limited.filled().len();
        if ready.is_ready() {
            buf.advance(n);
            self.left -= n;
        }
        ready
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn pair(open: Arc<AtomicBool>) -> (BoxRead, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let client = TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let (server, peer) = listener.accept().await.unwrap_or_else(|e| panic!("{e}"));
        let (read, _write) = Box::new(PreAuthStream::new(server, peer, addr, open)).split();
        (read, client)
    }

    #[tokio::test]
    async fn reads_past_the_budget_fail_until_the_gate_opens() {
        let open = Arc::new(AtomicBool::new(false));
        let (mut read, mut client) = pair(open.clone()).await;
        let sent = vec![7u8; PRE_AUTH_BYTES + 10];
        client
            .write_all(&sent)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut got = vec![0u8; PRE_AUTH_BYTES];
        read.read_exact(&mut got)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut more = [0u8; 4];
        let err = read
            .read(&mut more)
            .await
            .err()
            .unwrap_or_else(|| panic!("read past the budget"));
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);

        open.store(true, Ordering::Release);
        let mut rest = [0u8; 10];
        read.read_exact(&mut rest)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(rest, [7u8; 10]);
    }
}
