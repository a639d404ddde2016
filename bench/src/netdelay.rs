//! A network between the app and its primary, modelled at the TCP level: a proxy on loopback
//! that holds every new connection for one round trip before it reaches the server (the
//! handshake a real network charges) and delivers every chunk of bytes half a round trip
//! after it was sent, in each direction, in order and without holding back the chunks behind
//! it. So a statement on a new connection costs two round trips and one on a kept connection
//! one, as on a real network; a sleep before each statement would charge neither.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// A delaying proxy to `upstream`, listening on its own loopback port until the process
/// ends.
pub struct DelayProxy {
    pub port: u16,
}

impl DelayProxy {
    pub fn start(upstream: u16, rtt: Duration) -> anyhow::Result<DelayProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        thread::spawn(move || {
            for client in listener.incoming().flatten() {
                thread::spawn(move || {
                    // The handshake: one round trip before the first byte can flow.
                    thread::sleep(rtt);
                    if let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) {
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        relay(client, server, rtt / 2);
                    }
                });
            }
        });
        Ok(DelayProxy { port })
    }
}

/// Copies both ways between `a` and `b`, each chunk delivered `one_way` after it was read.
fn relay(a: TcpStream, b: TcpStream, one_way: Duration) {
    let (a2, b2) = match (a.try_clone(), b.try_clone()) {
        (Ok(a2), Ok(b2)) => (a2, b2),
        _ => return,
    };
    let up = thread::spawn(move || pump(a, b2, one_way));
    pump(b, a2, one_way);
    let _ = up.join();
}

fn pump(mut from: TcpStream, to: TcpStream, one_way: Duration) {
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
                if send
                    .send((Instant::now() + one_way, buffer[..n].to_vec()))
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
