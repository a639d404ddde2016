//! A network link between two servers on loopback, as the suites and the benchmark need one:
//! a TCP proxy that models distance, can be cut and restored, and counts the calls that
//! cross it.
//!
//! - **Distance**: every new connection is held for one round trip before it reaches the
//!   server (the handshake a real network charges), and every chunk of bytes is delivered
//!   half a round trip after it was sent, in each direction, in order, without holding back
//!   the chunks behind it. So a statement on a new connection costs two round trips and one
//!   on a kept connection one; a sleep before each statement would charge neither.
//! - **Cut**: every open connection is closed at once and new ones are closed as soon as
//!   they are accepted, until the link is restored.
//! - **Calls**: the bytes from client to server are read as HTTP/2 (what gRPC runs on, in
//!   the clear after the connection preface), and each stream the client opens is counted:
//!   one gRPC call, whatever it carries. A read replica's link to its primary carries its
//!   replication stream and one call per forwarded write program.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

/// A link to a server on a loopback port, listening on a loopback port of its own until the
/// process ends.
#[derive(Clone)]
pub struct Link {
    port: u16,
    state: Arc<LinkState>,
}

struct LinkState {
    upstream: u16,
    /// The round trip, in microseconds.
    rtt_us: AtomicU64,
    cut: AtomicBool,
    connections: AtomicU64,
    streams: AtomicU64,
    open: Mutex<Vec<TcpStream>>,
}

impl Link {
    /// A link to `upstream` with a round trip of `rtt` (zero: no delay).
    pub fn start(upstream: u16, rtt: Duration) -> std::io::Result<Link> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let state = Arc::new(LinkState {
            upstream,
            rtt_us: AtomicU64::new(rtt.as_micros() as u64),
            cut: AtomicBool::new(false),
            connections: AtomicU64::new(0),
            streams: AtomicU64::new(0),
            open: Mutex::new(Vec::new()),
        });
        let accepting = state.clone();
        thread::Builder::new()
            .name(format!("link-{port}"))
            .spawn(move || {
                for client in listener.incoming().flatten() {
                    let state = accepting.clone();
                    thread::spawn(move || state.carry(client));
                }
            })?;
        Ok(Link { port, state })
    }

    /// The port to connect to instead of the server's.
    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Closes every open connection, and every new one until [`Link::restore`].
    pub fn cut(&self) {
        self.state.cut.store(true, Ordering::SeqCst);
        for stream in self.state.open.lock().unwrap().drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    /// Makes the link `rtt` long for the bytes and connections that follow.
    pub fn set_rtt(&self, rtt: Duration) {
        self.state
            .rtt_us
            .store(rtt.as_micros() as u64, Ordering::SeqCst);
    }

    pub fn restore(&self) {
        self.state.cut.store(false, Ordering::SeqCst);
    }

    /// The HTTP/2 streams (gRPC calls) clients have opened across the link so far.
    pub fn streams(&self) -> u64 {
        self.state.streams.load(Ordering::SeqCst)
    }

    /// The TCP connections clients have opened across the link so far.
    pub fn connections(&self) -> u64 {
        self.state.connections.load(Ordering::SeqCst)
    }
}

impl LinkState {
    fn rtt(&self) -> Duration {
        Duration::from_micros(self.rtt_us.load(Ordering::SeqCst))
    }

    fn carry(self: Arc<Self>, client: TcpStream) {
        if self.cut.load(Ordering::SeqCst) {
            let _ = client.shutdown(Shutdown::Both);
            return;
        }
        self.connections.fetch_add(1, Ordering::SeqCst);
        // The handshake: one round trip before the first byte can flow.
        thread::sleep(self.rtt());
        let Ok(server) = TcpStream::connect(("127.0.0.1", self.upstream)) else {
            let _ = client.shutdown(Shutdown::Both);
            return;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        {
            let mut open = self.open.lock().unwrap();
            for stream in [&client, &server] {
                if let Ok(clone) = stream.try_clone() {
                    open.push(clone);
                }
            }
        }
        if self.cut.load(Ordering::SeqCst) {
            let _ = client.shutdown(Shutdown::Both);
            let _ = server.shutdown(Shutdown::Both);
            return;
        }
        let (Ok(client_out), Ok(server_out)) = (client.try_clone(), server.try_clone()) else {
            return;
        };
        let counted = self.clone();
        let up = thread::spawn(move || {
            let mut frames = Http2Streams::default();
            pump(client, server_out, &counted, |bytes| {
                let opened = frames.read(bytes);
                counted.streams.fetch_add(opened, Ordering::SeqCst);
            })
        });
        pump(server, client_out, &self, |_| {});
        let _ = up.join();
    }
}

/// Copies from `from` to `to`, each chunk delivered half the link's round trip after it was
/// read, and shown to `seen` as it is read.
fn pump(mut from: TcpStream, to: TcpStream, link: &LinkState, mut seen: impl FnMut(&[u8])) {
    let (send, receive) = mpsc::channel::<(Instant, Vec<u8>)>();
    let writer = thread::spawn(move || {
        let mut to = to;
        for (due, bytes) in receive {
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                thread::sleep(wait);
            }
            if to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                seen(&buffer[..n]);
                if send
                    .send((Instant::now() + link.rtt() / 2, buffer[..n].to_vec()))
                    .is_err()
                {
                    break;
                }
            }
        }
    }
    drop(send);
    let _ = writer.join();
}

/// The client side of an HTTP/2 connection, read frame by frame as its bytes pass: the
/// connection preface, then frames of a 9-byte header (length, type, flags, stream id) and a
/// payload. A HEADERS frame on a stream id above every one seen opens a stream.
#[derive(Default)]
struct Http2Streams {
    preface_left: Option<usize>,
    header: Vec<u8>,
    payload_left: usize,
    highest_stream: u32,
}

const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;
const HEADERS: u8 = 0x1;

impl Http2Streams {
    /// Reads `bytes`; how many streams they opened.
    fn read(&mut self, mut bytes: &[u8]) -> u64 {
        let mut opened = 0;
        let preface_left = self.preface_left.get_or_insert(PREFACE_LEN);
        let skip = (*preface_left).min(bytes.len());
        *preface_left -= skip;
        bytes = &bytes[skip..];
        while !bytes.is_empty() {
            if self.payload_left > 0 {
                let skip = self.payload_left.min(bytes.len());
                self.payload_left -= skip;
                bytes = &bytes[skip..];
                continue;
            }
            let take = (FRAME_HEADER_LEN - self.header.len()).min(bytes.len());
            self.header.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.header.len() < FRAME_HEADER_LEN {
                break;
            }
            let h = std::mem::take(&mut self.header);
            self.payload_left =
                (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
            let stream = u32::from_be_bytes([h[5] & 0x7f, h[6], h[7], h[8]]);
            if h[3] == HEADERS && stream > self.highest_stream {
                self.highest_stream = stream;
                opened += 1;
            }
        }
        opened
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut bytes = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, 0];
        bytes.extend_from_slice(&stream.to_be_bytes());
        bytes.extend_from_slice(payload);
        bytes
    }

    #[test]
    fn streams_are_counted_by_their_first_headers_frame_however_the_bytes_are_cut() {
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        bytes.extend(frame(0x4, 0, &[0; 6])); // SETTINGS
        bytes.extend(frame(HEADERS, 1, &[7; 20]));
        bytes.extend(frame(0x0, 1, &[1; 300])); // DATA
        bytes.extend(frame(HEADERS, 1, &[7; 5])); // trailers of stream 1
        bytes.extend(frame(HEADERS, 3, &[7; 20]));
        bytes.extend(frame(0x8, 0, &[0; 4])); // WINDOW_UPDATE
        for chunk in [1, 5, 9, 64, bytes.len()] {
            let mut streams = Http2Streams::default();
            let opened: u64 = bytes.chunks(chunk).map(|c| streams.read(c)).sum();
            assert_eq!(opened, 2, "read in chunks of {chunk}");
        }
    }
}
