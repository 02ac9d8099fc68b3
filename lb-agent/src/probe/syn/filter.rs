//! The classic BPF socket filter of the SYN check's raw socket: only SYN-ACKs and RSTs to
//! our claimed source ports reach it, not every TCP packet the host receives.

use std::io;
use std::os::fd::AsRawFd;

use socket2::Socket;

const BPF_LD: u16 = 0x00;
const BPF_LDX: u16 = 0x01;
const BPF_JMP: u16 = 0x05;
const BPF_RET: u16 = 0x06;
const BPF_ALU: u16 = 0x04;
const BPF_H: u16 = 0x08;
const BPF_B: u16 = 0x10;
const BPF_IND: u16 = 0x40;
const BPF_MSH: u16 = 0xa0;
const BPF_IMM: u16 = 0x00;
const BPF_JEQ: u16 = 0x10;
const BPF_JSET: u16 = 0x40;
const BPF_AND: u16 = 0x50;
const BPF_K: u16 = 0x00;

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The filter program. `ipv4`: packets start with the IP header (an IPv4 raw socket);
/// else with the TCP header (IPv6). Accepts TCP segments to one of `ports` whose flags
/// are SYN+ACK or include RST.
pub(super) fn program(ipv4: bool, ports: &[u16]) -> Vec<libc::sock_filter> {
    assert!(
        !ports.is_empty() && ports.len() < 250,
        "jump offsets are 8 bits"
    );
    let mut p = Vec::new();
    if ipv4 {
        // X = IP header length.
        p.push(stmt(BPF_LDX | BPF_B | BPF_MSH, 0));
    } else {
        p.push(stmt(BPF_LDX | BPF_IMM, 0));
    }
    // A = destination port.
    p.push(stmt(BPF_LD | BPF_H | BPF_IND, 2));
    let n = ports.len();
    for (i, &port) in ports.iter().enumerate() {
        // Match: on to the flags check right after the chain; else the next port, and
        // after the last one, drop.
        let left = (n - 1 - i) as u8;
        let jf = if i + 1 == n { 5 } else { 0 };
        p.push(jump(BPF_JMP | BPF_JEQ | BPF_K, u32::from(port), left, jf));
    }
    // A = flags.
    p.push(stmt(BPF_LD | BPF_B | BPF_IND, 13));
    // RST: accept.
    p.push(jump(BPF_JMP | BPF_JSET | BPF_K, 0x04, 2, 0));
    p.push(stmt(BPF_ALU | BPF_AND | BPF_K, 0x12));
    // SYN and ACK: accept, else drop.
    p.push(jump(BPF_JMP | BPF_JEQ | BPF_K, 0x12, 0, 1));
    p.push(stmt(BPF_RET | BPF_K, 0xffff));
    p.push(stmt(BPF_RET | BPF_K, 0));
    p
}

/// Attaches [`program`] to `sock` (`SO_ATTACH_FILTER`).
pub(super) fn attach(sock: &Socket, ipv4: bool, ports: &[u16]) -> io::Result<()> {
    let mut prog = program(ipv4, ports);
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_mut_ptr(),
    };
    // SAFETY: `fprog` points at `prog`, alive for the call; the kernel copies it.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            (&fprog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny interpreter of the instructions [`program`] uses, to test it without a
    /// socket (the root scenario tests it in the kernel).
    fn run(prog: &[libc::sock_filter], pkt: &[u8]) -> u32 {
        let (mut a, mut x, mut pc) = (0u32, 0u32, 0usize);
        let byte = |i: usize| u32::from(*pkt.get(i).unwrap_or(&0));
        loop {
            let ins = prog[pc];
            pc += 1;
            let k = ins.k;
            match ins.code {
                c if c == BPF_LDX | BPF_B | BPF_MSH => x = (byte(k as usize) & 0xf) * 4,
                c if c == BPF_LDX | BPF_IMM => x = k,
                c if c == BPF_LD | BPF_H | BPF_IND => {
                    let i = (x + k) as usize;
                    if i + 2 > pkt.len() {
                        return 0;
                    }
                    a = (byte(i) << 8) | byte(i + 1);
                }
                c if c == BPF_LD | BPF_B | BPF_IND => {
                    if (x + k) as usize >= pkt.len() {
                        return 0;
                    }
                    a = byte((x + k) as usize);
                }
                c if c == BPF_ALU | BPF_AND | BPF_K => a &= k,
                c if c == BPF_JMP | BPF_JEQ | BPF_K => {
                    pc += usize::from(if a == k { ins.jt } else { ins.jf })
                }
                c if c == BPF_JMP | BPF_JSET | BPF_K => {
                    pc += usize::from(if a & k != 0 { ins.jt } else { ins.jf })
                }
                c if c == BPF_RET | BPF_K => return k,
                c => panic!("unexpected opcode {c:#x}"),
            }
        }
    }

    fn tcp(dport: u16, flags: u8) -> Vec<u8> {
        let mut h = vec![0u8; 20];
        h[2..4].copy_from_slice(&dport.to_be_bytes());
        h[12] = 5 << 4;
        h[13] = flags;
        h
    }

    #[test]
    fn accepts_only_synack_and_rst_to_our_ports() {
        let ports = [40000, 40007, 51234];
        for ipv4 in [true, false] {
            let prog = program(ipv4, &ports);
            let pkt = |dport, flags| {
                let mut p = if ipv4 {
                    let mut ip = vec![0x45u8];
                    ip.resize(20, 0);
                    ip
                } else {
                    vec![]
                };
                p.extend(tcp(dport, flags));
                p
            };
            for port in ports {
                assert_ne!(run(&prog, &pkt(port, 0x12)), 0, "SYN-ACK to {port}");
                assert_ne!(run(&prog, &pkt(port, 0x14)), 0, "RST+ACK to {port}");
                assert_eq!(run(&prog, &pkt(port, 0x10)), 0, "plain ACK to {port}");
                assert_eq!(run(&prog, &pkt(port, 0x02)), 0, "SYN to {port}");
                assert_eq!(run(&prog, &pkt(port, 0x18)), 0, "data to {port}");
            }
            assert_eq!(run(&prog, &pkt(40001, 0x12)), 0, "SYN-ACK to another port");
            assert_eq!(run(&prog, &pkt(22, 0x14)), 0, "RST to another port");
        }
    }

    #[test]
    fn ipv4_header_length_is_honoured() {
        let prog = program(true, &[40000]);
        let mut p = vec![0x46u8];
        p.resize(24, 0);
        p.extend(tcp(40000, 0x12));
        assert_ne!(run(&prog, &p), 0);
        p[0] = 0x45; // the port would now be read from the options
        assert_eq!(run(&prog, &p), 0);
    }
}
