//! The bounds of `serve` on its clients: at most so many connections at once (one more
//! is answered 503 and closed, so a flood of clients cannot grow the process without
//! end), a connection whose client stopped reading is closed once a write has waited
//! [`STALL`], and one the server has written nothing to for [`IDLE`] is closed on its
//! next wait for the client: a client that sends nothing, or a request head one line
//! at a time, holds its slot for [`IDLE`] at most (an event stream writes every 15 s,
//! an answer as it reads). Not the memory a response holds (`files` streams in chunks).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long a write may wait for a client that reads nothing before its connection is
/// closed.
const STALL: Duration = Duration::from_secs(60);

/// How long a connection may go without the server writing to it: a request head
/// must be in within it, and a kept-alive connection is closed after it.
const IDLE: Duration = Duration::from_secs(20);

const REFUSAL: &str = "serve has as many connections open as it takes (--max-connections): try again shortly\n";

/// A listener that hands out at most `max` connections at once.
pub(super) struct Capped {
    listener: TcpListener,
    slots: Arc<Semaphore>,
    max: usize,
    /// Whether the last connection was refused: the warning is said once per crowd.
    refusing: bool,
}

impl Capped {
    pub(crate) fn new(listener: TcpListener, max: usize) -> Capped {
        Capped { listener, slots: Arc::new(Semaphore::new(max)), max, refusing: false }
    }
}

impl axum::serve::Listener for Capped {
    type Io = Slot;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Slot, std::net::SocketAddr) {
        loop {
            let (stream, addr) = match self.listener.accept().await {
                Ok(accepted) => accepted,
                // Out of descriptors and the like: wait a moment rather than spin.
                Err(err) => {
                    tracing::warn!("accepting a connection: {err}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            match self.slots.clone().try_acquire_owned() {
                Ok(permit) => {
                    self.refusing = false;
                    return (Slot::new(stream, permit), addr);
                }
                Err(_) => {
                    if !std::mem::replace(&mut self.refusing, true) {
                        tracing::warn!("{} connections open: refusing more until some close", self.max);
                    }
                    tokio::spawn(refuse(stream));
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.listener.local_addr()
    }
}

/// A 503, then the connection closed. The request is read (for a second at most)
/// before the close: closing over unread bytes resets the connection, and the client
/// would see the reset instead of the answer.
async fn refuse(mut stream: TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\nretry-after: 1\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{REFUSAL}",
        REFUSAL.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        io::Result::Ok(())
    })
    .await;
}

/// One connection, holding its slot until it closes.
pub(crate) struct Slot {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
    /// Since when a write has waited for the client to read.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
    /// [`IDLE`] from the last write (or the accept).
    idle: Pin<Box<tokio::time::Sleep>>,
}

impl Slot {
    fn new(stream: TcpStream, permit: OwnedSemaphorePermit) -> Slot {
        Slot { stream, _permit: permit, stalled: None, idle: Box::pin(tokio::time::sleep(IDLE)) }
    }

    /// A write that waits: fine until [`STALL`] has passed, then the connection's end.
    fn waiting(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let timer = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(STALL)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "the client stopped reading"))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn written(&mut self, result: Poll<io::Result<usize>>, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        match result {
            Poll::Pending => self.waiting(cx),
            ready => {
                self.stalled = None;
                if matches!(ready, Poll::Ready(Ok(n)) if n > 0) {
                    self.idle.as_mut().reset(tokio::time::Instant::now() + IDLE);
                }
                ready
            }
        }
    }
}

impl AsyncRead for Slot {
    /// A read the server waits on ends the connection once [`IDLE`] has passed
    /// without a write: bytes trickling in do not keep it.
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.idle.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "nothing asked of the server in time")));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Slot {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.written(result, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.written(result, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
