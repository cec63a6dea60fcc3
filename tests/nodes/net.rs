//! The test bed's network: one namespace for the master and one per node, each joined by a
//! veth pair to a bridge the test creates, on a private subnet that exists only inside
//! those namespaces.
//!
//! ```text
//!   ns kvm<pid>  (master, 10.241.0.1)  --veth--+
//!   ns kvn<pid>x0 (node 0, 10.241.0.10) --veth--+-- bridge kvb<pid> (no address: the host
//!   ns kvn<pid>x1 (node 1, 10.241.0.11) --veth--+   namespace takes no part)
//!   ...
//! ```
//!
//! Invariants:
//! - `nodes::net::T1`. Names carry the test process's id and a count of the beds it made,
//!   so parallel, successive or leftover runs never collide; addresses live only inside this run's namespaces and bridge, so the same
//!   subnet in another run is another network.
//! - `nodes::net::T2`. [`TestNet`]'s drop deletes every namespace and the bridge it
//!   created, on success, failure or panic (their veth pairs go with them).
//! - `nodes::net::T3`. Nothing outside these namespaces is contacted: every process of the
//!   test bed runs inside one of them, and the bridge has no address in the host.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// Test beds made by this process so far: part of every name (`nodes::net::T1`), since a
/// deleted namespace's interfaces may outlive it briefly.
static BEDS: AtomicU32 = AtomicU32::new(0);

/// The subnet's first three octets.
const SUBNET: &str = "10.241.0";

/// Why the network could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// `ip` could not run.
    #[error("running `ip {args}` failed")]
    Spawn {
        /// Its arguments.
        args: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// `ip` ran and failed.
    #[error("`ip {args}` failed: {stderr}")]
    Failed {
        /// Its arguments.
        args: String,
        /// What it said.
        stderr: String,
    },
}

/// The namespaces, veth pairs and bridge of one test (module docs).
pub struct TestNet {
    /// `kvb<pid>`.
    bridge: String,
    /// The master's namespace.
    master: String,
    /// One namespace per node, index = node.
    nodes: Vec<String>,
    /// The host side of each node's veth pair, index = node, then the master's.
    host_links: Vec<String>,
    /// Whether the master's namespace exists.
    master_made: bool,
}

impl TestNet {
    /// Creates the bridge, the master's namespace and `nodes` node namespaces, each linked
    /// to the bridge and given its address; loopback is up everywhere. A partial set-up is
    /// torn down again (`nodes::net::T2`).
    ///
    /// # Errors
    ///
    /// [`NetError`] when an `ip` command fails (not root, no `ip`).
    pub fn create(nodes: usize) -> Result<Self, NetError> {
        // At most 7 hex digits, so `kvh<id>x<n>i` stays within the 15 bytes of a link name.
        let id = format!(
            "{:x}{:x}",
            std::process::id() & 0x3f_ffff,
            BEDS.fetch_add(1, Ordering::Relaxed) & 0xf
        );
        let mut net = Self {
            bridge: format!("kvb{id}"),
            master: format!("kvm{id}"),
            nodes: Vec::new(),
            host_links: Vec::new(),
            master_made: false,
        };
        ip(&["link", "add", &net.bridge, "type", "bridge"])?;
        ip(&["link", "set", &net.bridge, "up"])?;
        let master = net.master.clone();
        let master_link = format!("kvh{id}m");
        net.attach(&master, &master_link, &Self::master_address())?;
        net.host_links.push(master_link);
        for node in 0..nodes {
            let namespace = format!("kvn{id}x{node}");
            let link = format!("kvh{id}x{node}");
            net.attach(&namespace, &link, &Self::node_address(node))?;
            net.nodes.push(namespace);
            net.host_links.insert(node, link);
        }
        Ok(net)
    }

    /// Makes `namespace`, links it to the bridge through `host_link` and gives it
    /// `address`; a namespace this fails to finish is deleted here (the caller records
    /// only finished ones).
    fn attach(&mut self, namespace: &str, host_link: &str, address: &str) -> Result<(), NetError> {
        ip(&["netns", "add", namespace])?;
        self.master_made |= namespace == self.master;
        let inner = format!("{host_link}i");
        let setup = || -> Result<(), NetError> {
            ip(&[
                "link", "add", host_link, "type", "veth", "peer", "name", &inner,
            ])?;
            ip(&["link", "set", &inner, "netns", namespace])?;
            ip(&["link", "set", host_link, "master", &self.bridge])?;
            ip(&["link", "set", host_link, "up"])?;
            ip(&[
                "-n",
                namespace,
                "addr",
                "add",
                &format!("{address}/24"),
                "dev",
                &inner,
            ])?;
            ip(&["-n", namespace, "link", "set", &inner, "up"])?;
            ip(&["-n", namespace, "link", "set", "lo", "up"])
        };
        setup().inspect_err(|_| {
            let _ = ip(&["link", "del", host_link]);
            if namespace != self.master {
                let _ = ip(&["netns", "del", namespace]);
            }
        })
    }

    /// The master's address.
    pub fn master_address() -> String {
        format!("{SUBNET}.1")
    }

    /// Node `node`'s address.
    pub fn node_address(node: usize) -> String {
        format!("{SUBNET}.{}", 10 + node)
    }

    /// The master's namespace.
    pub fn master_namespace(&self) -> &str {
        &self.master
    }

    /// Node `node`'s namespace.
    pub fn node_namespace(&self, node: usize) -> &str {
        &self.nodes[node]
    }

    /// `program` to run inside `namespace`, killed when the thread that spawned it ends
    /// (`setpriv --pdeathsig KILL`), so a test killed outright leaves nothing behind.
    pub fn command(namespace: &str, program: &Path) -> Command {
        let mut command = Command::new("ip");
        command
            .args([
                "netns",
                "exec",
                namespace,
                "setpriv",
                "--pdeathsig",
                "KILL",
                "--",
            ])
            .arg(program)
            .stdin(Stdio::null());
        command
    }

    /// Cuts node `node` off the bridge (`up` false) or connects it again: the host side of
    /// its veth pair goes down or up, so its namespace's end loses its carrier.
    ///
    /// # Errors
    ///
    /// [`NetError`] when `ip` fails.
    pub fn set_node_link(&self, node: usize, up: bool) -> Result<(), NetError> {
        let state = if up { "up" } else { "down" };
        ip(&["link", "set", &self.host_links[node], state])
    }

    /// Bytes node `node`'s namespace received and sent on its link to the bridge.
    ///
    /// # Errors
    ///
    /// [`NetError`] when `ip` fails.
    pub fn node_link_bytes(&self, node: usize) -> Result<(u64, u64), NetError> {
        let inner = format!("{}i", self.host_links[node]);
        let read = |what: &str| -> Result<u64, NetError> {
            let path = format!("/sys/class/net/{inner}/statistics/{what}_bytes");
            let text = ip_output(&["netns", "exec", &self.nodes[node], "cat", &path])?;
            Ok(text.trim().parse().unwrap_or(0))
        };
        Ok((read("rx")?, read("tx")?))
    }
}

impl Drop for TestNet {
    /// `nodes::net::T2`: the veth pairs (deleting one end deletes both, at once; a deleted
    /// namespace's interfaces go only when the kernel gets to it), the namespaces, then the
    /// bridge.
    fn drop(&mut self) {
        for link in &self.host_links {
            if let Err(err) = ip(&["link", "del", link]) {
                eprintln!("nodes test bed: deleting link {link}: {err}");
            }
        }
        let master = self.master_made.then_some(&self.master);
        for namespace in self.nodes.iter().chain(master) {
            if let Err(err) = ip(&["netns", "del", namespace]) {
                eprintln!("nodes test bed: deleting namespace {namespace}: {err}");
            }
        }
        if let Err(err) = ip(&["link", "del", &self.bridge]) {
            eprintln!("nodes test bed: deleting bridge {}: {err}", self.bridge);
        }
    }
}

/// Runs `ip args`.
fn ip(args: &[&str]) -> Result<(), NetError> {
    ip_output(args).map(drop)
}

/// Runs `ip args` (with `netns exec`, any program) and returns its stdout.
fn ip_output(args: &[&str]) -> Result<String, NetError> {
    let output = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| NetError::Spawn {
            args: args.join(" "),
            source,
        })?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(NetError::Failed {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}
