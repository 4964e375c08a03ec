//! The TCP addresses a process listens on, read from Linux's /proc.
//!
//! The tests and the demo start the gateway on port 0 and read back the
//! ports it bound, instead of picking a free port, releasing it and hoping
//! nobody takes it before the gateway binds it. The sockets are matched by
//! inode: the process's `/proc/<pid>/fd/*` links read `socket:[INODE]`, and
//! `/proc/<pid>/net/tcp` and `tcp6` list every socket of its network
//! namespace with its state, address and inode.
//!
//! Only std: `examples/demo.rs` includes this file too.

use std::collections::HashSet;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The kernel's state number for LISTEN in /proc/net/tcp.
const LISTEN: &str = "0A";

/// For each of `ips`, the first address on it that process `pid` listens
/// on; `None` until it listens on every one of them (Pingora binds its
/// listeners after the process has started).
pub fn listening_on(pid: u32, ips: &[IpAddr]) -> io::Result<Option<Vec<SocketAddr>>> {
    let all = listening(pid)?;
    Ok(ips
        .iter()
        .map(|ip| all.iter().find(|a| a.ip() == *ip).copied())
        .collect())
}

/// Every TCP address process `pid` holds a listening socket on.
pub fn listening(pid: u32) -> io::Result<Vec<SocketAddr>> {
    let mut inodes = HashSet::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        // An fd closed meanwhile has no link any more: not a listener.
        let Ok(link) = std::fs::read_link(fd?.path()) else {
            continue;
        };
        let inode = link
            .to_str()
            .and_then(|l| l.strip_prefix("socket:[")?.strip_suffix(']'));
        if let Some(inode) = inode {
            inodes.insert(inode.to_string());
        }
    }
    let mut out = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}"))?;
        // After the header: `sl local_address rem_address st ... inode ...`,
        // the inode being the tenth field.
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() > 9 && fields[3] == LISTEN && inodes.contains(fields[9]) {
                out.push(parse_address(fields[1]).ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidData, format!("{table}: {line}"))
                })?);
            }
        }
    }
    Ok(out)
}

/// `0100007F:1F90` (tcp) or 32 hex digits and a port (tcp6). The kernel
/// prints the address as 32-bit words in the machine's byte order, holding
/// the bytes in network order; the port as a plain number.
fn parse_address(hex: &str) -> Option<SocketAddr> {
    let (ip, port) = hex.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let mut bytes = Vec::with_capacity(16);
    for i in (0..ip.len()).step_by(8) {
        let word = u32::from_str_radix(ip.get(i..i + 8)?, 16).ok()?;
        bytes.extend_from_slice(&word.to_ne_bytes());
    }
    let ip = match bytes.len() {
        4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(bytes).ok()?)),
        16 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(bytes).ok()?)),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_decode_as_the_kernel_prints_them() {
        // Little-endian words, as on x86 and most ARM machines.
        if cfg!(target_endian = "little") {
            assert_eq!(
                parse_address("0100007F:1F90"),
                Some("127.0.0.1:8080".parse().unwrap())
            );
            assert_eq!(
                parse_address("00000000000000000000000001000000:0050"),
                Some("[::1]:80".parse().unwrap())
            );
        }
        assert_eq!(parse_address("0100007F"), None);
        assert_eq!(parse_address("0100007:1F90"), None);
    }

    #[test]
    fn a_listener_of_this_process_is_found_by_its_pid() {
        let listener = std::net::TcpListener::bind("127.0.0.3:0").unwrap();
        let v4 = listener.local_addr().unwrap();
        let pid = std::process::id();
        assert!(listening(pid).unwrap().contains(&v4));
        assert_eq!(
            listening_on(pid, &[v4.ip()]).unwrap(),
            Some(vec![v4]),
            "nothing else of this process listens on 127.0.0.3"
        );
        let nowhere = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 4));
        assert_eq!(listening_on(pid, &[v4.ip(), nowhere]).unwrap(), None);
        // A connected socket is not a listener.
        let conn = std::net::TcpStream::connect(v4).unwrap();
        assert!(!listening(pid)
            .unwrap()
            .contains(&conn.local_addr().unwrap()));
    }
}
