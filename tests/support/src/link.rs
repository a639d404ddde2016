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
//!   the clear after the connection preface), and each stream the client opens is recorded
//!   by its `:path`: one gRPC call. A read replica's link to its primary carries its
//!   replication calls and the calls that forward write statements.

use std::collections::HashMap;
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
    /// The `:path` of every HTTP/2 stream (gRPC call) clients opened, in order.
    calls: Mutex<Vec<String>>,
    /// Both ends of each connection being carried, by its number, so that a cut can close
    /// them; a connection's are dropped when it ends.
    open: Mutex<HashMap<u64, [TcpStream; 2]>>,
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
            calls: Mutex::new(Vec::new()),
            open: Mutex::new(HashMap::new()),
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
        for stream in self
            .state
            .open
            .lock()
            .unwrap()
            .drain()
            .flat_map(|(_, ends)| ends)
        {
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

    /// The HTTP/2 streams (gRPC calls) clients have opened across the link so far, by the
    /// call's path (e.g. `/proxy.Proxy/StreamExec`).
    pub fn calls(&self) -> Vec<String> {
        self.state.calls.lock().unwrap().clone()
    }

    /// The calls whose path contains `method`, so far.
    pub fn calls_to(&self, method: &str) -> usize {
        self.calls()
            .iter()
            .filter(|path| path.contains(method))
            .count()
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
        let number = self.connections.fetch_add(1, Ordering::SeqCst);
        // The handshake: one round trip before the first byte can flow.
        thread::sleep(self.rtt());
        let Ok(server) = TcpStream::connect(("127.0.0.1", self.upstream)) else {
            let _ = client.shutdown(Shutdown::Both);
            return;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        if let (Ok(client_end), Ok(server_end)) = (client.try_clone(), server.try_clone()) {
            self.open
                .lock()
                .unwrap()
                .insert(number, [client_end, server_end]);
        }
        let (Ok(client_out), Ok(server_out)) = (client.try_clone(), server.try_clone()) else {
            self.open.lock().unwrap().remove(&number);
            return;
        };
        if self.cut.load(Ordering::SeqCst) {
            let _ = client.shutdown(Shutdown::Both);
            let _ = server.shutdown(Shutdown::Both);
            self.open.lock().unwrap().remove(&number);
            return;
        }
        let counted = self.clone();
        let up = thread::spawn(move || {
            let mut frames = Http2Streams::default();
            pump(client, server_out, &counted, |bytes| {
                let opened = frames.read(bytes);
                counted.calls.lock().unwrap().extend(opened);
            })
        });
        pump(server, client_out, &self, |_| {});
        let _ = up.join();
        self.open.lock().unwrap().remove(&number);
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
/// payload. A HEADERS frame on a stream id above every one seen opens a stream; its header
/// block (with any CONTINUATION frames) is decoded with the connection's HPACK table for the
/// call's `:path`.
struct Http2Streams {
    preface_left: usize,
    header: Vec<u8>,
    /// The frame being read: its kind, flags, whether it opened a stream, and how much of
    /// its payload is still to come.
    frame: Option<Frame>,
    payload: Vec<u8>,
    highest_stream: u32,
    /// The header block being read, until its END_HEADERS, and whether it opens a stream.
    block: Vec<u8>,
    block_opens: bool,
    decoder: hpack::Decoder<'static>,
}

struct Frame {
    kind: u8,
    flags: u8,
    opens: bool,
    left: usize,
}

impl Default for Http2Streams {
    fn default() -> Http2Streams {
        Http2Streams {
            preface_left: PREFACE_LEN,
            header: Vec::new(),
            frame: None,
            payload: Vec::new(),
            highest_stream: 0,
            block: Vec::new(),
            block_opens: false,
            decoder: hpack::Decoder::new(),
        }
    }
}

const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

impl Http2Streams {
    /// Reads `bytes`; the `:path` of each stream they opened (empty if unreadable).
    fn read(&mut self, mut bytes: &[u8]) -> Vec<String> {
        let mut opened = Vec::new();
        let skip = self.preface_left.min(bytes.len());
        self.preface_left -= skip;
        bytes = &bytes[skip..];
        while !bytes.is_empty() {
            if let Some(frame) = &mut self.frame {
                let take = frame.left.min(bytes.len());
                if matches!(frame.kind, HEADERS | CONTINUATION) {
                    self.payload.extend_from_slice(&bytes[..take]);
                }
                frame.left -= take;
                bytes = &bytes[take..];
                if frame.left == 0 {
                    let frame = self.frame.take().expect("a frame");
                    if let Some(path) = self.frame_read(&frame) {
                        opened.push(path);
                    }
                }
                continue;
            }
            let take = (FRAME_HEADER_LEN - self.header.len()).min(bytes.len());
            self.header.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.header.len() < FRAME_HEADER_LEN {
                break;
            }
            let h = std::mem::take(&mut self.header);
            let length = (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
            let stream = u32::from_be_bytes([h[5] & 0x7f, h[6], h[7], h[8]]);
            let opens = h[3] == HEADERS && stream > self.highest_stream;
            if opens {
                self.highest_stream = stream;
            }
            let frame = Frame {
                kind: h[3],
                flags: h[4],
                opens,
                left: length,
            };
            if length == 0 {
                if let Some(path) = self.frame_read(&frame) {
                    opened.push(path);
                }
            } else {
                self.frame = Some(frame);
            }
        }
        opened
    }

    /// A whole frame was read (its payload, if a header block's, in `self.payload`): the
    /// path of the stream it finished opening, if it did.
    fn frame_read(&mut self, frame: &Frame) -> Option<String> {
        let payload = std::mem::take(&mut self.payload);
        match frame.kind {
            HEADERS => {
                let mut fragment = &payload[..];
                if frame.flags & PADDED != 0 && !fragment.is_empty() {
                    let pad = usize::from(fragment[0]);
                    fragment = &fragment[1..fragment.len().saturating_sub(pad).max(1)];
                }
                if frame.flags & PRIORITY != 0 {
                    fragment = &fragment[5.min(fragment.len())..];
                }
                self.block = fragment.to_vec();
                self.block_opens = frame.opens;
                self.end_of_block(frame.flags)
            }
            CONTINUATION => {
                self.block.extend_from_slice(&payload);
                self.end_of_block(frame.flags)
            }
            _ => None,
        }
    }

    /// At the end of a header block, decodes it (every block, trailers too, since the HPACK
    /// table follows them all); the `:path` if the block opened a stream.
    fn end_of_block(&mut self, flags: u8) -> Option<String> {
        if flags & END_HEADERS == 0 {
            return None;
        }
        let block = std::mem::take(&mut self.block);
        let headers = self.decoder.decode(&block).unwrap_or_default();
        self.block_opens.then(|| {
            headers
                .into_iter()
                .find(|(name, _)| name == b":path")
                .map(|(_, path)| String::from_utf8_lossy(&path).into_owned())
                .unwrap_or_default()
        })
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, stream: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut bytes = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        bytes.extend_from_slice(&stream.to_be_bytes());
        bytes.extend_from_slice(payload);
        bytes
    }

    #[test]
    fn calls_are_read_by_their_path_however_the_bytes_are_cut() {
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        bytes.extend(frame(0x4, 0, 0, &[0; 6])); // SETTINGS
        let mut encoder = hpack::Encoder::new();
        let request = |path: &[u8], encoder: &mut hpack::Encoder<'_>| {
            encoder.encode(vec![(&b":method"[..], &b"POST"[..]), (&b":path"[..], path)])
        };
        let first = request(b"/proxy.Proxy/StreamExec", &mut encoder);
        // The second block's path is in two parts, the second in a CONTINUATION frame.
        let second = request(b"/wal_log.ReplicationLog/LogEntries", &mut encoder);
        bytes.extend(frame(HEADERS, 1, 0x4, &first));
        bytes.extend(frame(0x0, 1, 0, &[1; 300])); // DATA
        bytes.extend(frame(
            HEADERS,
            1,
            0x4 | 0x1,
            &encoder.encode(vec![(&b"grpc-status"[..], &b"0"[..])]),
        )); // trailers of stream 1
        bytes.extend(frame(HEADERS, 3, 0, &second[..3]));
        bytes.extend(frame(CONTINUATION, 3, 0x4, &second[3..]));
        bytes.extend(frame(0x8, 0, 0, &[0; 4])); // WINDOW_UPDATE
        for chunk in [1, 5, 9, 64, bytes.len()] {
            let mut streams = Http2Streams::default();
            let opened: Vec<String> = bytes.chunks(chunk).flat_map(|c| streams.read(c)).collect();
            assert_eq!(
                opened,
                [
                    "/proxy.Proxy/StreamExec",
                    "/wal_log.ReplicationLog/LogEntries"
                ],
                "read in chunks of {chunk}"
            );
        }
    }
}
