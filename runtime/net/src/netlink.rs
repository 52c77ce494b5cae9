//! The few rtnetlink requests sandbox networking needs, spoken directly on a
//! `NETLINK_ROUTE` socket: create a veth pair with one end in another network namespace,
//! add an IPv4 address, set a link up, add a default route, delete a link.
//!
//! A netlink socket acts on the network namespace of the thread that opened it, so work
//! inside a sandbox's namespace runs on a short-lived thread that has joined it
//! ([`in_netns`]); the daemon's own threads never change namespace.
//!
//! Message layout (all host-endian): `nlmsghdr` (16 bytes), the family header
//! (`ifinfomsg` 16, `ifaddrmsg` 8, `rtmsg` 12), then attributes, each `rtattr` (length,
//! type) followed by its payload padded to 4 bytes; nested attributes carry attributes
//! as their payload. Every request asks for an acknowledgement and the answer is read
//! until the `NLMSG_ERROR` with its sequence number (0 = done, else a negative errno).

use nix::sys::socket::{
    bind, recv, send, socket, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol,
    SockType,
};
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_NEWADDR: u16 = 20;
const RTM_NEWROUTE: u16 = 24;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const IFLA_IFNAME: u16 = 3;
const IFLA_GROUP: u16 = 27;
const IFLA_LINKINFO: u16 = 18;
const IFLA_NET_NS_FD: u16 = 28;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const VETH_INFO_PEER: u16 = 1;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const AF_INET: u8 = libc::AF_INET as u8;
const IFF_UP: u32 = libc::IFF_UP as u32;
const RT_TABLE_MAIN: u8 = 254;
const RTPROT_BOOT: u8 = 3;
const RT_SCOPE_UNIVERSE: u8 = 0;
const RTN_UNICAST: u8 = 1;

/// A message under construction: header, family header, attributes.
struct Msg {
    buf: Vec<u8>,
    /// Start offsets of nested attributes still open.
    open: Vec<usize>,
}

impl Msg {
    fn new(kind: u16, flags: u16, family_header: &[u8]) -> Msg {
        let mut buf = vec![0u8; 16];
        buf[4..6].copy_from_slice(&kind.to_ne_bytes());
        buf[6..8].copy_from_slice(&(flags | NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        buf.extend_from_slice(family_header);
        Msg {
            buf,
            open: Vec::new(),
        }
    }

    fn pad(&mut self) {
        while self.buf.len() & 3 != 0 {
            self.buf.push(0);
        }
    }

    fn attr(&mut self, kind: u16, payload: &[u8]) -> &mut Msg {
        let len = (4 + payload.len()) as u16;
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(payload);
        self.pad();
        self
    }

    fn attr_str(&mut self, kind: u16, s: &str) -> &mut Msg {
        let mut v = s.as_bytes().to_vec();
        v.push(0);
        self.attr(kind, &v)
    }

    fn begin(&mut self, kind: u16) -> &mut Msg {
        self.open.push(self.buf.len());
        self.buf.extend_from_slice(&[0, 0]);
        // No NLA_F_NESTED: rtnetlink parses these nests liberally, as iproute2 sends them.
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self
    }

    /// Opens a nested attribute whose payload starts with a raw header (VETH_INFO_PEER
    /// carries an `ifinfomsg` before its attributes).
    fn begin_with(&mut self, kind: u16, header: &[u8]) -> &mut Msg {
        self.begin(kind);
        self.buf.extend_from_slice(header);
        self
    }

    fn end(&mut self) -> &mut Msg {
        let start = self.open.pop().expect("end() without begin()");
        let len = (self.buf.len() - start) as u16;
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        self
    }

    fn finish(mut self, seq: u32) -> Vec<u8> {
        assert!(self.open.is_empty(), "unclosed nested attribute");
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf[8..12].copy_from_slice(&seq.to_ne_bytes());
        self.buf
    }
}

fn ifinfomsg(index: i32, flags: u32, change: u32) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[4..8].copy_from_slice(&index.to_ne_bytes());
    h[8..12].copy_from_slice(&flags.to_ne_bytes());
    h[12..16].copy_from_slice(&change.to_ne_bytes());
    h
}

/// A `NETLINK_ROUTE` socket in the network namespace of the thread that opened it.
pub struct Route {
    fd: OwnedFd,
    seq: u32,
}

impl Route {
    pub fn open() -> io::Result<Route> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkRoute,
        )?;
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0))?;
        Ok(Route { fd, seq: 0 })
    }

    /// Sends one request and waits for its acknowledgement.
    fn request(&mut self, msg: Msg) -> io::Result<()> {
        self.seq += 1;
        let seq = self.seq;
        let bytes = msg.finish(seq);
        send(self.fd.as_raw_fd(), &bytes, MsgFlags::empty())?;
        let mut buf = vec![0u8; 8192];
        loop {
            let n = recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::empty())?;
            let mut off = 0;
            while off + 16 <= n {
                let len = u32::from_ne_bytes(buf[off..off + 4].try_into().unwrap()) as usize;
                let kind = u16::from_ne_bytes(buf[off + 4..off + 6].try_into().unwrap());
                let got = u32::from_ne_bytes(buf[off + 8..off + 12].try_into().unwrap());
                if len < 16 || off + len > n {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "truncated netlink answer",
                    ));
                }
                if kind == NLMSG_ERROR && got == seq && len >= 20 {
                    let err = i32::from_ne_bytes(buf[off + 16..off + 20].try_into().unwrap());
                    return if err == 0 {
                        Ok(())
                    } else {
                        Err(io::Error::from_raw_os_error(-err))
                    };
                }
                off += (len + 3) & !3;
            }
        }
    }

    /// Creates a veth pair: `name` here, in interface group `group`, and `peer`
    /// (created as `peer`) in the network namespace `peer_ns`.
    pub fn add_veth(
        &mut self,
        name: &str,
        group: u32,
        peer: &str,
        peer_ns: BorrowedFd<'_>,
    ) -> io::Result<()> {
        let mut m = Msg::new(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, &ifinfomsg(0, 0, 0));
        m.attr_str(IFLA_IFNAME, name)
            .attr(IFLA_GROUP, &group.to_ne_bytes())
            .begin(IFLA_LINKINFO)
            .attr_str(IFLA_INFO_KIND, "veth")
            .begin(IFLA_INFO_DATA)
            .begin_with(VETH_INFO_PEER, &ifinfomsg(0, 0, 0))
            .attr_str(IFLA_IFNAME, peer)
            .attr(IFLA_NET_NS_FD, &peer_ns.as_raw_fd().to_ne_bytes())
            .end()
            .end()
            .end();
        self.request(m)
    }

    /// Deletes the link `name`; one that does not exist is not an error.
    pub fn delete_link(&mut self, name: &str) -> io::Result<()> {
        let mut m = Msg::new(RTM_DELLINK, 0, &ifinfomsg(0, 0, 0));
        m.attr_str(IFLA_IFNAME, name);
        match self.request(m) {
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(()),
            other => other,
        }
    }

    pub fn set_up(&mut self, index: u32) -> io::Result<()> {
        let m = Msg::new(RTM_NEWLINK, 0, &ifinfomsg(index as i32, IFF_UP, IFF_UP));
        self.request(m)
    }

    pub fn add_address(&mut self, index: u32, addr: Ipv4Addr, prefix: u8) -> io::Result<()> {
        let mut h = [0u8; 8];
        h[0] = AF_INET;
        h[1] = prefix;
        h[4..8].copy_from_slice(&index.to_ne_bytes());
        let mut m = Msg::new(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, &h);
        m.attr(IFA_LOCAL, &addr.octets())
            .attr(IFA_ADDRESS, &addr.octets());
        self.request(m)
    }

    pub fn add_default_route(&mut self, index: u32, gateway: Ipv4Addr) -> io::Result<()> {
        let mut h = [0u8; 12];
        h[0] = AF_INET;
        h[4] = RT_TABLE_MAIN;
        h[5] = RTPROT_BOOT;
        h[6] = RT_SCOPE_UNIVERSE;
        h[7] = RTN_UNICAST;
        let mut m = Msg::new(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, &h);
        m.attr(RTA_GATEWAY, &gateway.octets())
            .attr(RTA_OIF, &index.to_ne_bytes());
        self.request(m)
    }
}

/// The index of interface `name` in the calling thread's network namespace.
pub fn index_of(name: &str) -> io::Result<u32> {
    nix::net::if_::if_nametoindex(name)
        .map_err(|e| io::Error::new(io::Error::from(e).kind(), format!("interface {name}: {e}")))
}

/// Runs `f` on a thread of its own that has joined the network namespace `ns`.
pub fn in_netns<T: Send>(
    ns: BorrowedFd<'_>,
    f: impl FnOnce() -> io::Result<T> + Send,
) -> io::Result<T> {
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| {
                io::Error::new(
                    io::Error::from(e).kind(),
                    format!("join network namespace: {e}"),
                )
            })?;
            f()
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("network namespace worker panicked")))
    })
}

/// A new network namespace with loopback up, as a descriptor (made on a thread of its
/// own, which then ends; the descriptor keeps the namespace alive).
pub fn new_netns() -> io::Result<OwnedFd> {
    std::thread::scope(|s| {
        s.spawn(|| -> io::Result<OwnedFd> {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| {
                io::Error::new(
                    io::Error::from(e).kind(),
                    format!("unshare network namespace: {e}"),
                )
            })?;
            forkd_sys::interface_up(c"lo")?;
            let f = std::fs::File::open("/proc/thread-self/ns/net")?;
            Ok(OwnedFd::from(f))
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("network namespace worker panicked")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_attributes_carry_their_lengths() {
        let mut m = Msg::new(RTM_NEWLINK, 0, &ifinfomsg(0, 0, 0));
        m.attr_str(IFLA_IFNAME, "ab")
            .begin(IFLA_LINKINFO)
            .attr_str(IFLA_INFO_KIND, "veth")
            .end();
        let b = m.finish(7);
        assert_eq!(
            u32::from_ne_bytes(b[0..4].try_into().unwrap()) as usize,
            b.len()
        );
        assert_eq!(u32::from_ne_bytes(b[8..12].try_into().unwrap()), 7);
        // ifname: 4 + "ab\0" = 7, padded to 8; then the nest: 4 + (4 + "veth\0" = 9 -> 12).
        let nest = 16 + 16 + 8;
        assert_eq!(
            u16::from_ne_bytes(b[nest..nest + 2].try_into().unwrap()),
            16
        );
        assert_eq!(
            u16::from_ne_bytes(b[nest + 2..nest + 4].try_into().unwrap()),
            IFLA_LINKINFO
        );
        assert_eq!(b.len(), nest + 16);
    }
}
