//! A throwaway HAProxy (Debian's `haproxy`) in TCP mode on a free loopback
//! port, balancing round robin over relay listeners — the load balancer in
//! front of several replicas (contract §12). TLS passes through to the
//! relays. A server that stops answering is taken out by a 200 ms health
//! check and a connect to it is redispatched, as a production balancer
//! would; killed with the test.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// A running HAProxy; stopped when dropped.
pub struct HaProxy {
    child: Child,
    /// Where clients connect.
    pub addr: SocketAddr,
    dir: PathBuf,
}

impl HaProxy {
    /// HAProxy in front of `backends`, or `None` (after a printed
    /// `SKIPPED` notice) when it is not installed — see [`super::external`].
    pub fn start(backends: &[SocketAddr]) -> Option<Self> {
        if !super::external("haproxy") {
            return None;
        }
        let port = super::reserved_port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let dir = super::relay::scratch_dir("haproxy");
        std::fs::create_dir_all(&dir).expect("haproxy dir");
        let servers: String = backends
            .iter()
            .enumerate()
            .map(|(i, b)| format!("  server r{i} {b} check inter 200 fall 1 rise 1\n"))
            .collect();
        let cfg = format!(
            "global\n  maxconn 4096\n\
             defaults\n  mode tcp\n  timeout connect 1s\n  timeout client 1h\n  timeout server 1h\n  \
             retries 3\n  option redispatch\n\
             frontend fe\n  bind {addr}\n  default_backend relays\n\
             backend relays\n  balance roundrobin\n{servers}"
        );
        let path = dir.join("haproxy.cfg");
        std::fs::write(&path, cfg).expect("haproxy.cfg");
        let child = Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("haproxy starts");
        let me = Self { child, addr, dir };
        let deadline = std::time::Instant::now() + super::WAIT;
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "haproxy listens in time"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Some(me)
    }
}

impl Drop for HaProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
