//! The network group: what `network = "isolated"` promises. A connection a firewall drops hangs
//! (the shell's bounded connect exits 124); one to a reachable address with nothing listening
//! is refused at once. So "unreachable" is told from "refused" without a listener inside.

use std::net::{IpAddr, Ipv4Addr, TcpListener};

use super::cases::{check, fail, text};
use super::{Context, Outcome};
use crate::ProcessOutcome;

/// What `timeout` exits with when the command ran out of time.
const TIMED_OUT: i32 = 124;

/// A shell line that opens a TCP connection to `ip:port` within `secs` seconds.
fn connect(ip: IpAddr, port: u16, secs: u32) -> String {
    format!("timeout {secs} bash -c 'exec 3<>/dev/tcp/{ip}/{port}' 2>&1; echo \"exit $?\"")
}

/// The exit status `connect` printed.
fn connect_status(outcome: &ProcessOutcome) -> Option<i32> {
    text(outcome)
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("exit ").and_then(|n| n.trim().parse().ok()))
}

fn gateway(c: &Context<'_>) -> Result<Ipv4Addr, Outcome> {
    c.runtime
        .isolation()
        .map(|i| i.config().subnet.gateway())
        .ok_or_else(|| fail("the back end was given no isolated network"))
}

/// Tries `ip:port` from machine `id`; `Ok(status)` of the bounded connect.
async fn try_connect(c: &Context<'_>, id: &str, ip: IpAddr, port: u16) -> Result<i32, Outcome> {
    let out = c.sh(id, &connect(ip, port, 5)).await?;
    let said = text(&out);
    check(!said.contains("not found"), || {
        format!("the machine cannot run the check: {said}")
    })?;
    connect_status(&out).ok_or_else(|| fail(format!("no exit status in {said:?}")))
}

/// A listener on the host's loopback and one on every host address: neither is reached, and
/// the host's address on the machines' side (their gateway) drops rather than refuses.
pub(super) async fn host_addresses_are_unreachable(c: &Context<'_>) -> Result<(), Outcome> {
    let gateway = gateway(c)?;
    let loopback = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    let every = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    loopback.set_nonblocking(true)?;
    every.set_nonblocking(true)?;
    let (id, _) = c.machine(0).await?;
    let port = loopback.local_addr()?.port();
    let status = try_connect(c, &id, IpAddr::V4(Ipv4Addr::LOCALHOST), port).await?;
    check(status != 0, || {
        format!("the machine connected to 127.0.0.1:{port}")
    })?;
    let port = every.local_addr()?.port();
    let status = try_connect(c, &id, IpAddr::V4(gateway), port).await?;
    check(status == TIMED_OUT, || {
        format!("a connection to the host's {gateway}:{port} ended with {status}, not dropped")
    })?;
    for listener in [&loopback, &every] {
        check(listener.accept().is_err(), || {
            "a host listener accepted a connection from the machine".to_owned()
        })?;
    }
    Ok(())
}

/// One machine's address, as it sees it: from the kernel's routing trie, or, where that file
/// is not kept (gVisor), as the source address a UDP socket would send to the run's "outside"
/// from (a UDP connect sends nothing).
async fn address_of(c: &Context<'_>, id: &str) -> Result<IpAddr, Outcome> {
    let outside = c
        .fixture
        .outside
        .map(|a| a.ip().to_string())
        .unwrap_or_else(|| "192.0.2.1".to_owned());
    let out = c
        .sh(
            id,
            &format!(
                "if [ -r /proc/net/fib_trie ]; then \
                   awk '/32 host/ {{ print f }} {{ f = $2 }}' /proc/net/fib_trie | grep -v '^127\\.' | head -n 1; \
                 else \
                   perl -MSocket -e 'socket(S, PF_INET, SOCK_DGRAM, 0) or die; connect(S, pack_sockaddr_in(9, inet_aton(\"{outside}\"))) or die; print inet_ntoa((unpack_sockaddr_in(getsockname(S)))[1])'; \
                 fi"
            ),
        )
        .await?;
    let said = text(&out);
    said.trim()
        .parse()
        .map_err(|_| fail(format!("machine {id} told no address: {said:?}")))
}

pub(super) async fn another_machine_is_unreachable(c: &Context<'_>) -> Result<(), Outcome> {
    let (first, _) = c.machine(0).await?;
    let (second, _) = c.machine(1).await?;
    let address = address_of(c, &second).await?;
    let status = try_connect(c, &first, address, 9).await?;
    check(status == TIMED_OUT, || {
        format!("a connection to the other machine's {address}:9 ended with {status}, not dropped")
    })
}

pub(super) async fn outbound_reaches_the_outside(c: &Context<'_>) -> Result<(), Outcome> {
    let Some(outside) = c.fixture.outside else {
        return Err(Outcome::Skip(
            "the fixture names no listener outside the host".to_owned(),
        ));
    };
    let (id, _) = c.machine(0).await?;
    let out = c
        .sh(&id, &connect(outside.ip(), outside.port(), 20))
        .await?;
    check(connect_status(&out) == Some(0), || {
        format!("the machine did not reach {outside}: {}", text(&out))
    })
}

pub(super) async fn ipv6_is_off(c: &Context<'_>) -> Result<(), Outcome> {
    let (id, _) = c.machine(0).await?;
    let out = c
        .sh(
            &id,
            "cat /proc/sys/net/ipv6/conf/all/disable_ipv6 2>/dev/null || echo absent; cat /proc/net/if_inet6 2>/dev/null | wc -l",
        )
        .await?;
    let said = text(&out);
    let mut lines = said.lines().map(str::trim);
    let (disabled, addresses) = (lines.next(), lines.next());
    check(
        matches!(disabled, Some("1" | "absent")) && addresses == Some("0"),
        || format!("IPv6 is on in the machine: {said:?}"),
    )
}

pub(super) async fn resolv_conf_names_the_resolvers(c: &Context<'_>) -> Result<(), Outcome> {
    let dns = c
        .runtime
        .isolation()
        .map(|i| i.config().dns.clone())
        .ok_or_else(|| fail("the back end was given no isolated network"))?;
    let (id, _) = c.machine(0).await?;
    let out = c.sh(&id, "cat /etc/resolv.conf").await?;
    let said = text(&out);
    // Docker's networks answer names at 127.0.0.11, inside the machine's own namespace, and
    // ask the resolvers given to the engine.
    if c.runtime.name() == "docker" && said.contains("nameserver 127.0.0.11") {
        return Ok(());
    }
    for ip in &dns {
        check(said.contains(&format!("nameserver {ip}")), || {
            format!("/etc/resolv.conf does not name {ip}: {said:?}")
        })?;
    }
    check(!said.contains("nameserver 127."), || {
        format!("/etc/resolv.conf names a loopback resolver: {said:?}")
    })
}
