//! Binaries under test: a child process whose output lines arrive on a channel as it prints them,
//! and one plain HTTP/1.1 request (the admin page, from outside the process).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::time::Duration;

/// A running child and the lines it printed (on whichever of stdout / stderr it was spawned with
/// piped).
pub struct ChildOutput {
    pub child: Child,
    /// The lines read so far by [`ChildOutput::wait_for`].
    pub seen: Vec<String>,
    rx: mpsc::Receiver<String>,
}

impl ChildOutput {
    /// Spawn `command` (`what` names it in panics) and read its piped output on threads.
    pub fn spawn(command: &mut Command, what: &str) -> ChildOutput {
        let mut child = command.spawn().unwrap_or_else(|e| panic!("{what} starts: {e}"));
        let (tx, rx) = mpsc::channel();
        let outputs = [
            child.stderr.take().map(|e| Box::new(e) as Box<dyn Read + Send>),
            child.stdout.take().map(|o| Box::new(o) as Box<dyn Read + Send>),
        ];
        for out in outputs.into_iter().flatten() {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        ChildOutput { child, seen: Vec::new(), rx }
    }

    /// The first line (from now) that `found` maps to a value. Kills the child and panics with
    /// every line so far when none comes within `timeout` (`what`: what was awaited).
    pub fn wait_for<T>(&mut self, timeout: Duration, what: &str, mut found: impl FnMut(&str) -> Option<T>) -> T {
        loop {
            let Ok(line) = self.rx.recv_timeout(timeout) else {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("no {what} within {timeout:?}:\n{}", self.seen.join("\n"));
            };
            self.seen.push(line);
            if let Some(v) = self.seen.last().and_then(|l| found(l)) {
                return v;
            }
        }
    }

    /// Stop the child (SIGKILL) and return every line it printed.
    pub fn stop(mut self) -> Vec<String> {
        self.child.kill().expect("kill");
        self.child.wait().expect("wait");
        self.seen.extend(self.rx.iter());
        self.seen
    }
}

/// One HTTP/1.1 request to `addr` with `Host: host`: (status, body).
pub fn http_request(
    addr: &str,
    host: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("read timeout");
    let mut req =
        format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).expect("send the request");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read the response");
    let status = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}
