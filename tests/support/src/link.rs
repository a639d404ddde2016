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
//! - **Calls and messages**: the bytes from client to server are read as HTTP/2 (what gRPC
//!   runs on, in the clear after the connection preface). Each stream the client opens is
//!   recorded by its `:path`: one gRPC call. Each gRPC message the client sends on a call (a
//!   length-prefixed protobuf in the stream's DATA frames) is recorded with its call's path
//!   and the numbers of its top-level fields: a streaming call carries many requests, so
//!   what a client asked for is counted by message, not by call. A read replica's link to
//!   its primary carries its replication calls and the call on which it forwards programs
//!   of write statements, one message per program.

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
    /// Every gRPC message clients sent, in order.
    messages: Mutex<Vec<Message>>,
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
            messages: Mutex::new(Vec::new()),
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

    /// The gRPC messages clients have sent across the link so far, in order.
    pub fn messages(&self) -> Vec<Message> {
        self.state.messages.lock().unwrap().clone()
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
                for seen in frames.read(bytes) {
                    match seen {
                        Seen::Call(path) => counted.calls.lock().unwrap().push(path),
                        Seen::Message(message) => counted.messages.lock().unwrap().push(message),
                    }
                }
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

/// A gRPC message a client sent across the link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// The path of the call it was sent on (e.g. `/proxy.Proxy/StreamExec`).
    pub path: String,
    /// The numbers of the protobuf fields at its top level, in order (which member of a
    /// `oneof` it carries, say); `None` if it could not be read (compressed, or not a
    /// protobuf).
    pub fields: Option<Vec<u32>>,
}

/// What a client's bytes were seen to do.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    /// Opened a stream (a gRPC call) with this `:path`.
    Call(String),
    /// Sent a whole gRPC message on a call.
    Message(Message),
}

/// The client side of an HTTP/2 connection, read frame by frame as its bytes pass: the
/// connection preface, then frames of a 9-byte header (length, type, flags, stream id) and a
/// payload. A HEADERS frame on a stream id above every one seen opens a stream; its header
/// block (with any CONTINUATION frames) is decoded with the connection's HPACK table for the
/// call's `:path`. The DATA frames of each stream are read as gRPC messages: a 1-byte
/// compression flag, a 4-byte big-endian length, the protobuf.
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
    /// The stream the header block being read is on.
    block_stream: u32,
    decoder: hpack::Decoder<'static>,
    /// The path of each open stream, and the bytes of its DATA not yet a whole message.
    streams: HashMap<u32, (String, Vec<u8>)>,
}

struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
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
            block_stream: 0,
            decoder: hpack::Decoder::new(),
            streams: HashMap::new(),
        }
    }
}

const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const GRPC_PREFIX_LEN: usize = 5;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

impl Http2Streams {
    /// Reads `bytes`; the streams they opened (by `:path`, empty if unreadable) and the
    /// messages they completed, in order.
    fn read(&mut self, mut bytes: &[u8]) -> Vec<Seen> {
        let mut opened = Vec::new();
        let skip = self.preface_left.min(bytes.len());
        self.preface_left -= skip;
        bytes = &bytes[skip..];
        while !bytes.is_empty() {
            if let Some(frame) = &mut self.frame {
                let take = frame.left.min(bytes.len());
                if matches!(frame.kind, DATA | HEADERS | CONTINUATION) {
                    self.payload.extend_from_slice(&bytes[..take]);
                }
                frame.left -= take;
                bytes = &bytes[take..];
                if frame.left == 0 {
                    let frame = self.frame.take().expect("a frame");
                    opened.extend(self.frame_read(&frame));
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
                stream,
                opens,
                left: length,
            };
            if length == 0 {
                opened.extend(self.frame_read(&frame));
            } else {
                self.frame = Some(frame);
            }
        }
        opened
    }

    /// A whole frame was read (its payload, if a header block's or DATA, in `self.payload`):
    /// the stream it finished opening or the messages it completed.
    fn frame_read(&mut self, frame: &Frame) -> Vec<Seen> {
        let payload = std::mem::take(&mut self.payload);
        let seen = match frame.kind {
            DATA => {
                let mut data = &payload[..];
                if frame.flags & PADDED != 0 && !data.is_empty() {
                    let pad = usize::from(data[0]);
                    data = &data[1..data.len().saturating_sub(pad).max(1)];
                }
                self.messages(frame.stream, data)
            }
            RST_STREAM => {
                self.streams.remove(&frame.stream);
                Vec::new()
            }
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
                self.block_stream = frame.stream;
                self.end_of_block(frame.flags)
                    .map(Seen::Call)
                    .into_iter()
                    .collect()
            }
            CONTINUATION => {
                self.block.extend_from_slice(&payload);
                self.end_of_block(frame.flags)
                    .map(Seen::Call)
                    .into_iter()
                    .collect()
            }
            _ => Vec::new(),
        };
        if frame.flags & END_STREAM != 0 && matches!(frame.kind, DATA | HEADERS) {
            self.streams.remove(&frame.stream);
        }
        seen
    }

    /// `data` arrived on `stream`: the gRPC messages it completed.
    fn messages(&mut self, stream: u32, data: &[u8]) -> Vec<Seen> {
        let Some((path, pending)) = self.streams.get_mut(&stream) else {
            return Vec::new();
        };
        pending.extend_from_slice(data);
        let mut whole = Vec::new();
        while pending.len() >= GRPC_PREFIX_LEN {
            let length = u32::from_be_bytes([pending[1], pending[2], pending[3], pending[4]]);
            let end = GRPC_PREFIX_LEN + length as usize;
            if pending.len() < end {
                break;
            }
            let compressed = pending[0] != 0;
            let fields = (!compressed)
                .then(|| protobuf_fields(&pending[GRPC_PREFIX_LEN..end]))
                .flatten();
            whole.push(Seen::Message(Message {
                path: path.clone(),
                fields,
            }));
            pending.drain(..end);
        }
        whole
    }

    /// At the end of a header block, decodes it (every block, trailers too, since the HPACK
    /// table follows them all); the `:path` if the block opened a stream.
    fn end_of_block(&mut self, flags: u8) -> Option<String> {
        if flags & END_HEADERS == 0 {
            return None;
        }
        let block = std::mem::take(&mut self.block);
        let headers = self.decoder.decode(&block).unwrap_or_default();
        let path = self.block_opens.then(|| {
            headers
                .into_iter()
                .find(|(name, _)| name == b":path")
                .map(|(_, path)| String::from_utf8_lossy(&path).into_owned())
                .unwrap_or_default()
        })?;
        self.streams
            .insert(self.block_stream, (path.clone(), Vec::new()));
        Some(path)
    }
}

/// The numbers of the top-level fields of a protobuf message, in order; `None` if it is not
/// one (a field's key, length or value runs past the end, or a wire type is unknown).
fn protobuf_fields(mut bytes: &[u8]) -> Option<Vec<u32>> {
    fn varint(bytes: &mut &[u8]) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = bytes.split_first()?;
            *bytes = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }
    let mut fields = Vec::new();
    while !bytes.is_empty() {
        let key = varint(&mut bytes)?;
        let skip = match key & 0x7 {
            0 => {
                varint(&mut bytes)?;
                0
            }
            1 => 8,
            2 => usize::try_from(varint(&mut bytes)?).ok()?,
            5 => 4,
            _ => return None,
        };
        bytes = bytes.get(skip..)?;
        fields.push(u32::try_from(key >> 3).ok()?);
    }
    Some(fields)
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

    /// A gRPC message: not compressed, its length, the protobuf.
    fn grpc(protobuf: &[u8]) -> Vec<u8> {
        let mut bytes = vec![0];
        bytes.extend_from_slice(&(protobuf.len() as u32).to_be_bytes());
        bytes.extend_from_slice(protobuf);
        bytes
    }

    #[test]
    fn calls_and_their_messages_are_read_however_the_bytes_are_cut() {
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
        // Two programs on the one call (field 2, `execute`; the first with request id 0,
        // which proto3 leaves out), the second message cut across two DATA frames, the
        // second of them padded; then a `describe` (field 3).
        let program = [0x12, 0x03, 0x0a, 0x01, 0x00];
        let mut messages = grpc(&program);
        messages.extend(grpc(&[[0x08, 0x01].as_slice(), &program].concat()));
        let (head, tail) = messages.split_at(7);
        bytes.extend(frame(DATA, 1, 0, head));
        bytes.extend(frame(
            DATA,
            1,
            PADDED,
            &[&[2u8][..], tail, &[0, 0]].concat(),
        ));
        bytes.extend(frame(HEADERS, 3, 0, &second[..3]));
        bytes.extend(frame(CONTINUATION, 3, 0x4, &second[3..]));
        bytes.extend(frame(DATA, 3, 0, &grpc(&[0x08, 0x07])));
        bytes.extend(frame(DATA, 1, END_STREAM, &grpc(&[0x08, 0x02, 0x1a, 0x00])));
        bytes.extend(frame(0x8, 0, 0, &[0; 4])); // WINDOW_UPDATE
        let message = |path: &str, fields: &[u32]| {
            Seen::Message(Message {
                path: path.to_owned(),
                fields: Some(fields.to_vec()),
            })
        };
        let exec = "/proxy.Proxy/StreamExec";
        let log = "/wal_log.ReplicationLog/LogEntries";
        for chunk in [1, 5, 9, 64, bytes.len()] {
            let mut streams = Http2Streams::default();
            let seen: Vec<Seen> = bytes.chunks(chunk).flat_map(|c| streams.read(c)).collect();
            assert_eq!(
                seen,
                [
                    Seen::Call(exec.to_owned()),
                    message(exec, &[2]),
                    message(exec, &[1, 2]),
                    Seen::Call(log.to_owned()),
                    message(log, &[1]),
                    message(exec, &[1, 3]),
                ],
                "read in chunks of {chunk}"
            );
            assert!(!streams.streams.contains_key(&1), "stream 1 ended");
        }
    }

    #[test]
    fn a_message_that_is_not_a_protobuf_has_no_fields() {
        assert_eq!(protobuf_fields(&[0x12, 0x05, 0x00]), None);
        assert_eq!(protobuf_fields(&[0x0f]), None);
        assert_eq!(protobuf_fields(&[]), Some(Vec::new()));
    }
}
