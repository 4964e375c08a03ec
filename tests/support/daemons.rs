//! Gateways run as daemons (`-d`) and upgraded gracefully (`-u`, then
//! SIGQUIT to the old process), as systemd's reload does.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use crate::support::eventually;
use crate::support::gateway::Conf;

/// Daemons are not our children: kill whatever pids we saw at the end.
pub struct Daemons {
    pub conf: Conf,
    pub pids: Vec<u32>,
}

impl Daemons {
    pub fn pid(&self) -> u32 {
        self.conf.pid().unwrap_or(0)
    }

    /// The pid of a daemon other than `old`, once it has written it.
    pub async fn next_pid(&self, old: u32) -> u32 {
        eventually("a new pid in the pid file", || async {
            ![0, old].contains(&self.pid())
        })
        .await;
        self.pid()
    }

    /// Start `poimen-gateway -d [-u] -c FILE`; its foreground process exits
    /// once it has forked the daemon (after taking the sockets over, with -u).
    pub fn start(&self, upgrade: bool) -> tokio::process::Child {
        let args: &[&str] = if upgrade { &["-d", "-u"] } else { &["-d"] };
        tokio::process::Command::from(self.conf.command(args))
            .spawn()
            .unwrap()
    }
}

impl Drop for Daemons {
    fn drop(&mut self) {
        for pid in self.pids.iter().chain([self.pid()].iter()) {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
        if std::thread::panicking() {
            eprintln!("--- daemon log ---\n{}", self.conf.log());
        }
    }
}

/// A graceful upgrade: the new process first (it waits for the sockets),
/// then SIGQUIT to the old one, which hands them over and drains. The new
/// daemon must hold the very sockets the old one had: `listening`.
pub async fn upgrade(d: &mut Daemons, listening: (SocketAddr, SocketAddr)) -> u32 {
    let old = d.pid();
    d.pids.push(old);
    let mut new = d.start(true);
    // Pingora removes the upgrade socket after each handover, so it exists
    // once the new process waits on it.
    let sock = d.conf.upgrade_sock();
    eventually("the new process waiting on the upgrade socket", || async {
        sock.exists()
    })
    .await;
    Command::new("kill")
        .args(["-QUIT", &old.to_string()])
        .status()
        .unwrap();
    assert!(new.wait().await.unwrap().success(), "upgrade failed");
    let pid = d.next_pid(old).await;
    assert_eq!(
        d.conf.listening(pid).await,
        listening,
        "the new daemon does not listen on the old one's sockets"
    );
    old
}

/// `systemctl reload`: the unit's reload script (the package's
/// `/usr/lib/poimen-gateway/reload`) on this config and the binary at `bin`,
/// as the unit's ExecReload= and a package upgrade run it. Returns the old pid.
pub async fn reload(d: &mut Daemons, listening: (SocketAddr, SocketAddr), bin: &Path) -> u32 {
    let old = d.pid();
    d.pids.push(old);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/systemd/poimen-gateway-reload");
    // The new daemon inherits the script's stdout and stderr.
    let status = tokio::process::Command::new("sh")
        .arg(script)
        .arg(d.conf.path())
        .env("POIMEN_GATEWAY_BIN", bin)
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(d.conf.log_file())
        .status()
        .await
        .unwrap();
    assert!(status.success(), "the reload failed: {}", d.conf.log());
    let pid = d.pid();
    assert!(pid != old, "the reload left pid {old}: {}", d.conf.log());
    assert_eq!(
        d.conf.listening(pid).await,
        listening,
        "the new daemon does not listen on the old one's sockets"
    );
    old
}
