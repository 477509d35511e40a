//! How a head listens for nodes, and how a node joins its head.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::Duration,
};

use flotilla_core::Resources;
use flotilla_replica::LogSettings;

use super::Cookie;

/// The port a head listens on by default (ractor_cluster's examples' port).
pub const DEFAULT_HEAD_PORT: u16 = 4697;
/// How often head and node send each other a heartbeat.
pub const HEARTBEAT: Duration = Duration::from_millis(500);
/// Silence after which a peer is lost (its session is stopped).
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(2);
/// How often silence is checked: a lost peer is declared within
/// `HEARTBEAT_TIMEOUT + CHECK_PERIOD`.
pub const CHECK_PERIOD: Duration = Duration::from_millis(250);
/// How long a restarted head waits for its nodes to re-attach.
pub const REATTACH_GRACE: Duration = Duration::from_secs(2);

/// The default [`HeadOptions::adopt_timeout`].
pub const ADOPT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long an inbound connection may take to authenticate before it is
/// closed (ractor_cluster's handshake is three round trips).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

fn machine_cpus() -> f64 {
    std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64)
}

/// How the head listens for nodes (`ServeOptions::nodes`).
///
/// ```
/// use flotilla_cluster::nodes::{Cookie, HeadOptions};
/// let head = HeadOptions::new(Cookie::new("s3cret").unwrap())
///     .listen("127.0.0.1:0".parse().unwrap());
/// assert!(head.validate().is_ok());
/// let open = HeadOptions::new(Cookie::new("s3cret").unwrap())
///     .listen("0.0.0.0:4697".parse().unwrap());
/// assert!(open.validate().is_err(), "off loopback, the cookie must come from a file or env");
/// ```
#[derive(Debug, Clone)]
pub struct HeadOptions {
    /// Where to listen (default `127.0.0.1:4697`; port 0 picks one, see
    /// `Serve::node_address`).
    pub listen: SocketAddr,
    /// The shared secret.
    pub cookie: Cookie,
    /// The head's own node id, where head-local replicas run (default `head`).
    pub node_id: String,
    /// What the head offers replicas (default: this machine's CPUs).
    pub resources: Resources,
    /// Pack replicas onto the fullest node with room instead of spreading
    /// them (default: spread, as `StaticCluster`).
    pub pack: bool,
    /// Heartbeat period (default 500 ms).
    pub heartbeat: Duration,
    /// Silence after which a node is lost (default 2 s).
    pub heartbeat_timeout: Duration,
    /// How long a restarted head waits for nodes to re-attach before it
    /// recovers its checkpoint (default 2 s; zero: not at all).
    pub reattach_grace: Duration,
    /// How long a connection may take to authenticate before it is closed
    /// (default [`HANDSHAKE_TIMEOUT`]); at most 64 wait at once.
    pub handshake_timeout: Duration,
    /// How long a replica a node re-attached with waits for a deployment of
    /// this head to adopt it before it is stopped (default [`ADOPT_TIMEOUT`]):
    /// a head restarted on another store, or whose checkpoint no longer has
    /// that deployment, does not leave it running, and holding its place,
    /// for ever. Longer than recovering the checkpoint takes.
    pub adopt_timeout: Duration,
}

/// Why head options cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    /// A head or node listening off loopback was given its cookie in code.
    #[error(
        "the {role} listens on {listen}, off loopback: its cookie must come from a file or an \
         environment variable (Cookie::from_file, Cookie::from_env), not from code"
    )]
    InlineCookieOffLoopback {
        /// `head` or `node`.
        role: &'static str,
        /// The address (a node's port as `listen_port` gives it: 0 for one
        /// the system picks when it starts).
        listen: SocketAddr,
    },
    /// A head or node listening off loopback was given a cookie shorter than
    /// [`MIN_EXPOSED_SECRET_LEN`](flotilla_core::MIN_EXPOSED_SECRET_LEN)
    /// bytes: ractor_cluster's challenge crosses the network in plaintext, so
    /// one handshake seen is enough to guess a short cookie offline.
    #[error(
        "the {role} listens on {listen}, off loopback: its cookie must be at least {min} bytes \
         long (it is {len}); generate one, for example with `openssl rand -hex 16`"
    )]
    WeakCookieOffLoopback {
        /// `head` or `node`.
        role: &'static str,
        /// The address (a node's port as `listen_port` gives it).
        listen: SocketAddr,
        /// The cookie's length in bytes.
        len: usize,
        /// The shortest allowed.
        min: usize,
    },
    /// A node was told to advertise an address that names no interface.
    #[error("a node cannot be dialed on {ip}: advertise an address of one of its interfaces")]
    AdvertiseUnspecified {
        /// The address (`0.0.0.0` or `::`).
        ip: IpAddr,
    },
    /// A period is zero, or the timeout is not above the period.
    #[error("heartbeat_timeout ({timeout:?}) must be above a non-zero heartbeat ({period:?})")]
    Heartbeat {
        /// The period.
        period: Duration,
        /// The timeout.
        timeout: Duration,
    },
    /// A wait is zero (where zero would spin) or longer than
    /// [`flotilla_core::MAX_DURATION`].
    #[error(
        "{field} ({value:?}) must be at most {max:?} (and, but for reattach_grace, above zero)"
    )]
    Duration {
        /// The option.
        field: &'static str,
        /// Its value.
        value: Duration,
        /// The longest allowed.
        max: Duration,
    },
    /// The resources a head or node offers are not amounts a replica could
    /// be placed against (a NaN, an infinity, a negative amount, an unnamed
    /// custom resource).
    #[error("the {role}'s resources: {source}")]
    Resources {
        /// `head` or `node`.
        role: &'static str,
        /// What is wrong (boxed: the error is large, and rare).
        #[source]
        source: Box<flotilla_core::Error>,
    },
    /// A node or head id (or a node's name) that is empty, too long, or holds
    /// characters ractor names cannot.
    #[error("{what} {id:?} must be 1 to {max} letters, digits, '-', '_' or '.'")]
    NodeId {
        /// `node id` or `node name`.
        what: &'static str,
        /// The id.
        id: String,
        /// The longest allowed.
        max: usize,
    },
}

/// The longest node id.
pub(crate) const MAX_NODE_ID: usize = 64;
/// What a node adds to its name to make its id (`-` and six hex digits).
pub(crate) const NODE_ID_SUFFIX: usize = 7;

/// `resources` are amounts a replica can be placed against (see
/// [`Resources::validate`]); the head checks a joining node's with it too.
pub(crate) fn check_resources(
    role: &'static str,
    resources: &Resources,
) -> Result<(), OptionsError> {
    resources
        .validate()
        .map_err(|source| OptionsError::Resources {
            role,
            source: Box::new(source),
        })
}

pub(crate) fn check_id(id: &str) -> Result<(), OptionsError> {
    check_chars("node id", id, MAX_NODE_ID)
}

fn check_chars(what: &'static str, id: &str, max: usize) -> Result<(), OptionsError> {
    let ok = !id.is_empty()
        && id.len() <= max
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(OptionsError::NodeId {
            what,
            id: id.to_owned(),
            max,
        })
    }
}

/// Off loopback, anyone who can read the program can read an inline cookie:
/// it must come from a file or the environment; and a short one can be
/// guessed from one handshake seen ([`flotilla_core::exposable`]).
fn check_cookie(
    role: &'static str,
    listen: SocketAddr,
    cookie: &Cookie,
) -> Result<(), OptionsError> {
    if listen.ip().is_loopback() {
        return Ok(());
    }
    if cookie.source() == super::CookieSource::Inline {
        return Err(OptionsError::InlineCookieOffLoopback { role, listen });
    }
    if !flotilla_core::exposable(cookie.secret()) {
        return Err(OptionsError::WeakCookieOffLoopback {
            role,
            listen,
            len: cookie.secret().len(),
            min: flotilla_core::MIN_EXPOSED_SECRET_LEN,
        });
    }
    Ok(())
}

fn check_heartbeat(period: Duration, timeout: Duration) -> Result<(), OptionsError> {
    if period.is_zero() || timeout <= period {
        return Err(OptionsError::Heartbeat { period, timeout });
    }
    check_waits(&[("heartbeat", period), ("heartbeat_timeout", timeout)])
}

/// Each wait must be above zero (a zero redial would spin) and at most
/// [`flotilla_core::MAX_DURATION`] (a timer beyond it overflows the clock).
fn check_waits(waits: &[(&'static str, Duration)]) -> Result<(), OptionsError> {
    let max = flotilla_core::MAX_DURATION;
    match waits.iter().find(|(_, d)| d.is_zero() || *d > max) {
        Some(&(field, value)) => Err(OptionsError::Duration { field, value, max }),
        None => Ok(()),
    }
}

impl HeadOptions {
    /// Defaults around `cookie`.
    pub fn new(cookie: Cookie) -> Self {
        HeadOptions {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), DEFAULT_HEAD_PORT),
            cookie,
            node_id: "head".to_owned(),
            resources: Resources::none().with_cpus(machine_cpus()),
            pack: false,
            heartbeat: HEARTBEAT,
            heartbeat_timeout: HEARTBEAT_TIMEOUT,
            reattach_grace: REATTACH_GRACE,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            adopt_timeout: ADOPT_TIMEOUT,
        }
    }

    /// Listen on `addr`.
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = addr;
        self
    }

    /// The head offers `resources`.
    pub fn resources(mut self, resources: Resources) -> Self {
        self.resources = resources;
        self
    }

    /// Call the head's own node `id`.
    pub fn node_id(mut self, id: impl Into<String>) -> Self {
        self.node_id = id.into();
        self
    }

    /// Pack replicas instead of spreading them.
    pub fn pack(mut self) -> Self {
        self.pack = true;
        self
    }

    /// Wait `grace` for nodes to re-attach after a restart.
    pub fn reattach_grace(mut self, grace: Duration) -> Self {
        self.reattach_grace = grace;
        self
    }

    /// Heartbeat every `period`; a node silent for `timeout` is lost.
    pub fn heartbeat(mut self, period: Duration, timeout: Duration) -> Self {
        self.heartbeat = period;
        self.heartbeat_timeout = timeout;
        self
    }

    /// Close a connection that has not authenticated within `timeout`.
    pub fn handshake_timeout(mut self, timeout: Duration) -> Self {
        self.handshake_timeout = timeout;
        self
    }

    /// Stop a re-attached replica no deployment adopted within `timeout`.
    pub fn adopt_timeout(mut self, timeout: Duration) -> Self {
        self.adopt_timeout = timeout;
        self
    }

    /// Check the options as a whole (`Serve::start` does).
    pub fn validate(&self) -> Result<(), OptionsError> {
        check_cookie("head", self.listen, &self.cookie)?;
        check_id(&self.node_id)?;
        check_resources("head", &self.resources)?;
        check_heartbeat(self.heartbeat, self.heartbeat_timeout)?;
        check_waits(&[
            ("handshake_timeout", self.handshake_timeout),
            ("adopt_timeout", self.adopt_timeout),
        ])?;
        let max = flotilla_core::MAX_DURATION;
        if self.reattach_grace > max {
            return Err(OptionsError::Duration {
                field: "reattach_grace",
                value: self.reattach_grace,
                max,
            });
        }
        Ok(())
    }
}

/// How a node joins its head (`flotilla::node::run`).
///
/// ```
/// use flotilla_cluster::nodes::{Cookie, NodeOptions};
/// use flotilla_core::Resources;
/// let node = NodeOptions::new("127.0.0.1:4697".parse().unwrap(), Cookie::new("s3cret").unwrap())
///     .name("gpu-box")
///     .resources(Resources::none().with_cpus(8.0).with_gpus(1.0))
///     .label("zone", "a");
/// assert!(node.validate().is_ok());
/// ```
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// The head's address.
    pub head: SocketAddr,
    /// The shared secret.
    pub cookie: Cookie,
    /// The node's name; its node id is the name and a random suffix, new at
    /// every (re)join as a new node (default `node`).
    pub name: String,
    /// What it offers (default: this machine's CPUs).
    pub resources: Resources,
    /// Labels, shown in the head's node list.
    pub labels: Vec<(String, String)>,
    /// The address this node's listener binds, for other nodes to dial
    /// (default `127.0.0.1`; `0.0.0.0` or `::` binds every interface).
    pub listen: IpAddr,
    /// The port it binds (default 0: one the system picks; give one to open
    /// a firewall for it).
    pub listen_port: u16,
    /// The address other nodes are told to dial this one on (default: the
    /// one it binds; for an address that binds every interface, the one
    /// this machine reaches its head from, which a peer on the head's
    /// network reaches it at too). Give it where that is not so (a NAT).
    pub advertise: Option<IpAddr>,
    /// How often the node sends the head, and each peer node it has a
    /// session with, a heartbeat, which the other side answers (default
    /// 500 ms).
    pub heartbeat: Duration,
    /// Silence from the head, or from a peer node, after which its session is
    /// dropped (default 2 s); the answers to the node's heartbeats count, and
    /// so does every other frame. It must be longer than the largest frame
    /// takes on the link.
    pub heartbeat_timeout: Duration,
    /// How long one dial of the head may take (default 2 s).
    pub connect_timeout: Duration,
    /// Wait after the first failed dial of the head (default 250 ms); it
    /// doubles per failure since the last session, up to 1 s (or this, if
    /// longer).
    pub redial: Duration,
    /// How long a connection from another node may take to authenticate
    /// before it is closed (default [`HANDSHAKE_TIMEOUT`]).
    pub handshake_timeout: Duration,
    /// Peer nodes this node reaches at another address than the one they
    /// listen on (a port forward, a NAT, a TCP proxy): `(listen, via)` pairs
    /// (see [`dial_peer_via`](Self::dial_peer_via)). Empty by default.
    pub peer_routes: Vec<(SocketAddr, SocketAddr)>,
    /// The logging settings this node's replicas log by: the head's, which
    /// it sends whole on joining and after every change (the applied config
    /// file's, each application's and deployment's `logging_config`). Give
    /// them to the process's log layer (`flotilla::AppLogLayer`) for them
    /// to apply; a clone shares them.
    pub logging: LogSettings,
}

impl NodeOptions {
    /// Defaults for a node joining the head at `head` with `cookie`.
    pub fn new(head: SocketAddr, cookie: Cookie) -> Self {
        NodeOptions {
            head,
            cookie,
            name: "node".to_owned(),
            resources: Resources::none().with_cpus(machine_cpus()),
            labels: Vec::new(),
            listen: IpAddr::V4(Ipv4Addr::LOCALHOST),
            listen_port: 0,
            advertise: None,
            heartbeat: HEARTBEAT,
            heartbeat_timeout: HEARTBEAT_TIMEOUT,
            connect_timeout: Duration::from_secs(2),
            redial: Duration::from_millis(250),
            handshake_timeout: HANDSHAKE_TIMEOUT,
            peer_routes: Vec::new(),
            logging: LogSettings::new(),
        }
    }

    /// Dial the peer node that listens on `listen` (as the head lists it) at
    /// `via` instead: a port forward, a NAT or a TCP proxy between the two.
    /// The peer is still known by its own name; only where this node dials
    /// it changes. A later route for the same `listen` replaces an earlier.
    ///
    /// ```
    /// # use flotilla_cluster::nodes::{Cookie, NodeOptions};
    /// let options = NodeOptions::new("10.0.0.1:7000".parse().unwrap(), Cookie::new("secret").unwrap())
    ///     .dial_peer_via("10.0.0.7:41000".parse().unwrap(), "192.168.1.7:41000".parse().unwrap());
    /// assert_eq!(options.peer_dial_address("10.0.0.7:41000"), "192.168.1.7:41000");
    /// assert_eq!(options.peer_dial_address("10.0.0.8:41000"), "10.0.0.8:41000");
    /// ```
    pub fn dial_peer_via(mut self, listen: SocketAddr, via: SocketAddr) -> Self {
        self.peer_routes.retain(|(l, _)| *l != listen);
        self.peer_routes.push((listen, via));
        self
    }

    /// Where this node dials the peer that listens on `listen`: its route
    /// ([`dial_peer_via`](Self::dial_peer_via)), or `listen` itself.
    pub fn peer_dial_address(&self, listen: &str) -> String {
        let route = listen
            .parse::<SocketAddr>()
            .ok()
            .and_then(|at| self.peer_routes.iter().rev().find(|(l, _)| *l == at));
        match route {
            Some((_, via)) => via.to_string(),
            None => listen.to_owned(),
        }
    }

    /// Name the node.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// It offers `resources`.
    pub fn resources(mut self, resources: Resources) -> Self {
        self.resources = resources;
        self
    }

    /// Add a label.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.push((key.into(), value.into()));
        self
    }

    /// Bind its listener to `ip` (`0.0.0.0`: every interface).
    pub fn listen(mut self, ip: IpAddr) -> Self {
        self.listen = ip;
        self
    }

    /// Bind its listener to `port` (0: one the system picks).
    pub fn listen_port(mut self, port: u16) -> Self {
        self.listen_port = port;
        self
    }

    /// Tell other nodes to dial it on `ip` (see [`NodeOptions::advertise`]).
    pub fn advertise(mut self, ip: IpAddr) -> Self {
        self.advertise = Some(ip);
        self
    }

    /// The address other nodes are told to dial this one on: `advertise`,
    /// else `listen`, else (`listen` binds every interface) the local
    /// address of this machine's route to the head, which the system picks
    /// without sending anything.
    ///
    /// ```
    /// # use flotilla_cluster::nodes::{Cookie, NodeOptions};
    /// let head = "127.0.0.1:4697".parse().unwrap();
    /// let node = NodeOptions::new(head, Cookie::new("s3cret").unwrap())
    ///     .listen("0.0.0.0".parse().unwrap());
    /// assert_eq!(node.advertised().unwrap().to_string(), "127.0.0.1");
    /// ```
    pub fn advertised(&self) -> std::io::Result<IpAddr> {
        if let Some(ip) = self.advertise {
            return Ok(ip);
        }
        if !self.listen.is_unspecified() {
            return Ok(self.listen);
        }
        // From the head's family: an IPv6 head from `0.0.0.0`, or an IPv4
        // one from `::` (a mapped address), would fail or mislead.
        let any: IpAddr = match self.head {
            SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
        };
        let socket = std::net::UdpSocket::bind(SocketAddr::new(any, 0))?;
        socket.connect(self.head)?;
        Ok(socket.local_addr()?.ip().to_canonical())
    }

    /// Heartbeat every `period`; a head or peer node silent for `timeout`
    /// has its session dropped.
    pub fn heartbeat(mut self, period: Duration, timeout: Duration) -> Self {
        self.heartbeat = period;
        self.heartbeat_timeout = timeout;
        self
    }

    /// Check the options as a whole (`run` does).
    pub fn validate(&self) -> Result<(), OptionsError> {
        check_cookie(
            "node",
            SocketAddr::new(self.listen, self.listen_port),
            &self.cookie,
        )?;
        if let Some(ip) = self.advertise.filter(IpAddr::is_unspecified) {
            return Err(OptionsError::AdvertiseUnspecified { ip });
        }
        // Its id is the name and a suffix, and must pass `check_id` at the head.
        check_chars("node name", &self.name, MAX_NODE_ID - NODE_ID_SUFFIX)?;
        check_resources("node", &self.resources)?;
        check_heartbeat(self.heartbeat, self.heartbeat_timeout)?;
        check_waits(&[
            ("connect_timeout", self.connect_timeout),
            ("redial", self.redial),
            ("handshake_timeout", self.handshake_timeout),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_of_zero_or_beyond_the_longest_duration_is_refused_by_name() {
        let cookie = || Cookie::new("secret").unwrap_or_else(|e| panic!("{e}"));
        let node = || {
            NodeOptions::new(
                "127.0.0.1:1".parse().unwrap_or_else(|e| panic!("{e}")),
                cookie(),
            )
        };
        let field = |r: Result<(), OptionsError>| match r {
            Err(OptionsError::Duration { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert!(node().validate().is_ok());
        let mut n = node();
        n.redial = Duration::ZERO;
        assert_eq!(field(n.validate()), "redial");
        let mut n = node();
        n.connect_timeout = Duration::MAX;
        assert_eq!(field(n.validate()), "connect_timeout");
        let n = node().heartbeat(Duration::from_secs(1), Duration::MAX);
        assert_eq!(field(n.validate()), "heartbeat_timeout");
        let mut n = node();
        n.handshake_timeout = Duration::ZERO;
        assert_eq!(field(n.validate()), "handshake_timeout");
        let head = || HeadOptions::new(cookie());
        assert!(head().reattach_grace(Duration::ZERO).validate().is_ok());
        assert_eq!(
            field(head().handshake_timeout(Duration::ZERO).validate()),
            "handshake_timeout"
        );
        assert_eq!(
            field(head().reattach_grace(Duration::MAX).validate()),
            "reattach_grace"
        );
        assert_eq!(
            field(head().adopt_timeout(Duration::ZERO).validate()),
            "adopt_timeout"
        );
    }

    #[test]
    fn resources_no_replica_could_be_placed_against_are_refused_for_head_and_node() {
        let cookie = || Cookie::new("secret").unwrap_or_else(|e| panic!("{e}"));
        let head_addr: SocketAddr = "127.0.0.1:1".parse().unwrap_or_else(|e| panic!("{e}"));
        let role = |r: Result<(), OptionsError>| match r {
            Err(OptionsError::Resources { role, .. }) => role,
            other => panic!("{other:?}"),
        };
        for bad in [
            Resources::none().with_cpus(f64::NAN),
            Resources::none().with_gpus(f64::INFINITY),
            Resources::none().with_cpus(-1.0),
            Resources::none().with_custom("", 1.0),
        ] {
            let head = HeadOptions::new(cookie()).resources(bad.clone());
            assert_eq!(role(head.validate()), "head", "{bad:?}");
            let node = NodeOptions::new(head_addr, cookie()).resources(bad.clone());
            assert_eq!(role(node.validate()), "node", "{bad:?}");
        }
        let fine = Resources::none().with_cpus(4.0).with_custom("tpu", 1.0);
        assert!(
            HeadOptions::new(cookie())
                .resources(fine)
                .validate()
                .is_ok()
        );
    }

    #[test]
    fn a_node_listening_off_loopback_refuses_an_inline_cookie_as_a_head_does() {
        let open: IpAddr = "0.0.0.0".parse().unwrap_or_else(|e| panic!("{e}"));
        let head: SocketAddr = "127.0.0.1:1".parse().unwrap_or_else(|e| panic!("{e}"));
        let inline = Cookie::new("secret").unwrap_or_else(|e| panic!("{e}"));
        match NodeOptions::new(head, inline.clone())
            .listen(open)
            .validate()
        {
            Err(OptionsError::InlineCookieOffLoopback {
                role: "node",
                listen,
            }) => {
                assert_eq!(listen.ip(), open);
            }
            other => panic!("{other:?}"),
        }
        assert!(NodeOptions::new(head, inline).validate().is_ok());
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("cookie");
        // From a file, off loopback it must be long enough not to be guessed
        // from a handshake seen.
        std::fs::write(&path, "secret").unwrap_or_else(|e| panic!("{e}"));
        let short = Cookie::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
        match NodeOptions::new(head, short.clone())
            .listen(open)
            .validate()
        {
            Err(OptionsError::WeakCookieOffLoopback {
                role: "node",
                len: 6,
                min: 16,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        assert!(NodeOptions::new(head, short).validate().is_ok());
        std::fs::write(&path, "7f3a9c0e5b2d4f61").unwrap_or_else(|e| panic!("{e}"));
        let from_file = Cookie::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            NodeOptions::new(head, from_file)
                .listen(open)
                .validate()
                .is_ok()
        );
        // A file's final newline goes; a second line is refused, naming the
        // file (never the secret), not cut off silently.
        std::fs::write(&path, "secret\n").unwrap_or_else(|e| panic!("{e}"));
        assert!(Cookie::from_file(&path).is_ok_and(|c| c.secret() == "secret"));
        std::fs::write(&path, "secret\n# rotated\n").unwrap_or_else(|e| panic!("{e}"));
        match Cookie::from_file(&path) {
            Err(
                e @ super::super::CookieError::Invalid {
                    source: flotilla_core::SecretError::NotOneLine,
                    ..
                },
            ) => {
                let text = e.to_string();
                assert!(text.contains(&path.display().to_string()), "{text}");
                assert!(
                    !text.contains("secret\n") && !text.contains("rotated"),
                    "{text}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_node_advertises_what_it_was_told_else_what_it_binds_else_its_route_to_the_head() {
        let ip = |s: &str| -> IpAddr { s.parse().unwrap_or_else(|e| panic!("{e}")) };
        let head: SocketAddr = "127.0.0.1:1".parse().unwrap_or_else(|e| panic!("{e}"));
        let node = NodeOptions::new(head, Cookie::new("s").unwrap_or_else(|e| panic!("{e}")));
        let advertised = |o: &NodeOptions| o.advertised().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(advertised(&node), ip("127.0.0.1"));
        assert_eq!(
            advertised(&node.clone().listen(ip("127.0.0.2"))),
            ip("127.0.0.2")
        );
        let every = node.clone().listen(ip("0.0.0.0"));
        assert_eq!(advertised(&every), ip("127.0.0.1"), "the route to the head");
        // Binding IPv6's every interface, to an IPv4 head: its own address,
        // not a v4-mapped one (which `dial_peer_via` routes could not match).
        let every6 = node.clone().listen(ip("::"));
        assert_eq!(advertised(&every6), ip("127.0.0.1"));
        let told = every.clone().advertise(ip("10.1.2.3"));
        assert_eq!(advertised(&told), ip("10.1.2.3"));
        match node.clone().advertise(ip("0.0.0.0")).validate() {
            Err(OptionsError::AdvertiseUnspecified { .. }) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_node_name_leaves_room_for_its_ids_suffix() {
        let head: SocketAddr = "127.0.0.1:1".parse().unwrap_or_else(|e| panic!("{e}"));
        let node = |name: String| {
            NodeOptions::new(head, Cookie::new("s").unwrap_or_else(|e| panic!("{e}"))).name(name)
        };
        let longest = "n".repeat(MAX_NODE_ID - NODE_ID_SUFFIX);
        assert!(node(longest.clone()).validate().is_ok());
        let id = format!("{longest}-{}", super::super::head::random_suffix());
        assert_eq!(id.len(), MAX_NODE_ID);
        assert!(
            check_id(&id).is_ok(),
            "the longest name's id passes the head's check"
        );
        match node(format!("{longest}n")).validate() {
            Err(OptionsError::NodeId {
                what: "node name",
                max: 57,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
    }
}
