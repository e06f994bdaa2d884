//! Refusing a subnet another part of the host already uses: two daemons (or a daemon and an
//! engine's own network) handing out the same addresses would route one's replies to the
//! other's machines. What the host routes is read from `/proc/net/route`; a route is this
//! daemon's own when it goes through its bridge (Docker) or to an address its IPAM holds
//! reserved (containerd's `ptp` routes each machine's address).

use std::collections::HashSet;
use std::net::Ipv4Addr;

use super::{Isolation, Subnet};
use crate::{ErrorKind, Result, RuntimeError};

/// One IPv4 route of the main table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Route {
    pub interface: String,
    pub destination: Ipv4Addr,
    pub prefix: u8,
}

/// The routes `/proc/net/route` lists (its addresses are network-order words in hex).
pub(super) fn parse_routes(table: &str) -> Vec<Route> {
    let word = |hex: &str| u32::from_str_radix(hex, 16).ok().map(u32::to_ne_bytes);
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (interface, destination, mask) = (fields.first()?, fields.get(1)?, fields.get(7)?);
            let mask = u32::from_be_bytes(word(mask)?);
            Some(Route {
                interface: (*interface).to_owned(),
                destination: Ipv4Addr::from(word(destination)?),
                prefix: u8::try_from(mask.count_ones()).ok()?,
            })
        })
        .collect()
}

impl Subnet {
    /// Whether `destination/prefix` shares an address with this subnet.
    pub(super) fn overlaps(&self, destination: Ipv4Addr, prefix: u8) -> bool {
        let common = prefix.min(self.prefix);
        if common == 0 {
            return true;
        }
        let mask = u32::MAX << (32 - u32::from(common));
        u32::from(destination) & mask == u32::from(self.network) & mask
    }
}

impl Isolation {
    /// Refuses the configured subnet when a route of the host's reaches into it that this
    /// daemon did not make (another daemon's machines or bridge, a VPN, a LAN), naming it.
    /// The default route is no allocation and is left out.
    pub fn check_overlaps(&self) -> Result<()> {
        let table = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
        self.check_routes(&parse_routes(&table), &self.reserved_addresses())
    }

    fn check_routes(&self, routes: &[Route], reserved: &HashSet<Ipv4Addr>) -> Result<()> {
        let subnet = self.config.subnet;
        let foreign: Vec<String> = routes
            .iter()
            .filter(|r| r.prefix > 0 && subnet.overlaps(r.destination, r.prefix))
            .filter(|r| r.interface != self.bridge())
            .filter(|r| !(r.prefix == 32 && reserved.contains(&r.destination)))
            .map(|r| format!("{}/{} dev {}", r.destination, r.prefix, r.interface))
            .collect();
        if foreign.is_empty() {
            return Ok(());
        }
        Err(RuntimeError::plain(
            ErrorKind::Other,
            format!(
                "network: [network] subnet {subnet} overlaps what this host already routes and this daemon did not make ({}); another daemon or network uses those addresses, so choose a subnet of its own for this one",
                foreign.join(", ")
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::NetworkConfig;
    use super::*;

    const TABLE: &str =
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
        eth0\t00000000\t0100000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
        eth0\t0000000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
        nry-t1\t0000590A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n\
        veth1\t0500590A\t00000000\t0005\t0\t0\t0\tFFFFFFFF\t0\t0\t0\n";

    fn isolation(subnet: &str) -> (Isolation, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let isolation = Isolation::new(NetworkConfig {
            tag: "t1".to_owned(),
            subnet: subnet.parse().unwrap(),
            dns: Vec::new(),
            cni_bin_dirs: Vec::new(),
            run_dir: dir.path().to_owned(),
        })
        .unwrap();
        (isolation, dir)
    }

    #[test]
    fn the_route_table_is_read_in_network_order() {
        let routes = parse_routes(TABLE);
        assert_eq!(routes.len(), 4);
        assert_eq!(routes[1].destination, Ipv4Addr::new(10, 0, 0, 0));
        assert_eq!(routes[1].prefix, 24);
        assert_eq!(routes[3].destination, Ipv4Addr::new(10, 89, 0, 5));
        assert_eq!(routes[3].prefix, 32);
    }

    #[test]
    fn a_route_this_daemon_did_not_make_into_its_subnet_is_named() {
        let routes = parse_routes(TABLE);
        let (ours, _dir) = isolation("10.89.0.0/16");
        let reserved = HashSet::from([Ipv4Addr::new(10, 89, 0, 5)]);
        // Its own bridge and its own machine's address: fine; the default route is none.
        assert!(ours.check_routes(&routes, &reserved).is_ok());
        // Another daemon's machine at an address this one never reserved.
        let refused = ours.check_routes(&routes, &HashSet::new()).unwrap_err();
        assert!(
            refused.to_string().contains("10.89.0.5/32 dev veth1"),
            "{refused}"
        );
        // A subnet inside the host's LAN.
        let (lan, _dir) = isolation("10.0.0.0/28");
        let refused = lan.check_routes(&routes, &reserved).unwrap_err();
        assert!(
            refused.to_string().contains("10.0.0.0/24 dev eth0"),
            "{refused}"
        );
        let (apart, _dir) = isolation("10.200.0.0/16");
        assert!(apart.check_routes(&routes, &HashSet::new()).is_ok());
    }
}
