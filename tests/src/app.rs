//! A tiny app beside a daemon, for the app-health gate: its health
//! endpoint answers 200 or 500 as told.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(Debug)]
pub struct App {
    port: u16,
    /// Whether the health endpoint answers 200 (else 500).
    pub healthy: Arc<AtomicBool>,
}

impl App {
    pub fn start(healthy: bool) -> App {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let flag = Arc::new(AtomicBool::new(healthy));
        let h = flag.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { return };
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf);
                let status = if h.load(Ordering::SeqCst) {
                    "200 OK"
                } else {
                    "500 Oops"
                };
                let _ = write!(
                    s,
                    "HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
            }
        });
        App {
            port,
            healthy: flag,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/healthz", self.port)
    }
}
