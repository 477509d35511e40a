//! Nodes on loopback: a head and two node processes of this same binary.
//! The head deploys three applications spread over itself and the nodes, calls
//! them, then crashes node `b` (through a deployment placed on it that aborts
//! its process, as a machine dies) and shows its replicas replaced on the head
//! and node `a`. See `docs/nodes.md`.
//!
//! Run, in three terminals (the cookie must be the same in all three):
//!
//! ```sh
//! FLOTILLA_COOKIE=demo-cookie cargo run --release --example nodes -- head
//! FLOTILLA_COOKIE=demo-cookie cargo run --release --example nodes -- node a
//! FLOTILLA_COOKIE=demo-cookie cargo run --release --example nodes -- node b
//! ```
//!
//! The head waits for both nodes; `node a` keeps running (and dialing the head
//! again) after the head ends: stop it with Ctrl-C.

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, SocketAddr},
    time::{Duration, Instant},
};

use flotilla::{
    ApplicationSpec, ApplicationStatus, Cookie, Deployment, DeploymentSpec, HeadOptions, Registry,
    Resources, RunManyOptions, Serve, ServeOptions, UserError,
};

/// Where the head listens (loopback, Flotilla's default node port).
const HEAD: SocketAddr = SocketAddr::new(
    std::net::IpAddr::V4(Ipv4Addr::LOCALHOST),
    flotilla::DEFAULT_HEAD_PORT,
);

/// Says hello, and where it runs.
struct Hello {
    app: String,
    node: String,
    replica: u64,
}

impl Deployment for Hello {
    type Request = String;
    type Response = String;
    async fn handle(&self, name: String) -> Result<String, UserError> {
        Ok(format!(
            "{}: hello {name}, from replica {} on node {}",
            self.app, self.replica, self.node
        ))
    }
}

/// Placed on node `b` only: asked to "crash", it aborts its whole process.
struct Chaos;

impl Deployment for Chaos {
    type Request = String;
    type Response = String;
    async fn handle(&self, what: String) -> Result<String, UserError> {
        if what == "crash" {
            eprintln!("chaos: aborting this node process, as a machine crash would");
            std::process::abort();
        }
        Ok(what)
    }
}

fn registry() -> Result<Registry, flotilla::SpecError> {
    Registry::new()
        .register("nodes::Hello", |ctx| async move {
            Ok(Hello {
                app: ctx.app.to_string(),
                node: ctx.node.clone(),
                replica: ctx.replica.0,
            })
        })?
        .register("nodes::Chaos", |_ctx| async { Ok(Chaos) })
}

fn cookie() -> Result<Cookie, flotilla::CookieError> {
    Cookie::from_env("FLOTILLA_COOKIE")
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .try_init();
    let Err(e) = run().await else {
        return std::process::ExitCode::SUCCESS;
    };
    eprintln!("error: {}", flotilla::with_causes(e.as_ref()));
    std::process::ExitCode::FAILURE
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["head"] => head().await,
        ["node", name] => node(name).await,
        _ => Err("usage: nodes head | nodes node NAME".into()),
    }
}

/// A node: 4 CPUs and a resource naming it (`node:NAME`), so a deployment can
/// ask for this very node.
async fn node(name: &str) -> Result<(), Box<dyn std::error::Error>> {
    let options = flotilla::node::NodeOptions::new(HEAD, cookie()?)
        .name(name)
        .resources(
            Resources::none()
                .with_cpus(4.0)
                .with_custom(format!("node:{name}"), 1.0),
        );
    println!(
        "node {name} (pid {}) joining the head at {HEAD}",
        std::process::id()
    );
    flotilla::node::run(registry()?, options).await?;
    Ok(())
}

fn hello(name: &str) -> Result<ApplicationSpec, flotilla::SpecError> {
    ApplicationSpec::builder(name)
        .route_prefix(format!("/{name}"))
        .deployment(
            DeploymentSpec::builder("hello", "nodes::Hello")
                .replicas(2)
                .with_config(|c| c.with_resources(Resources::none().with_cpus(1.0))),
        )
        .build()
}

const APPS: [&str; 3] = ["greet", "welcome", "salute"];

/// Each application's replicas, by node.
async fn placement(serve: &Serve) -> Result<(), Box<dyn std::error::Error>> {
    for app in APPS {
        let mut on: BTreeMap<String, Vec<String>> = BTreeMap::new();
        if let Some(s) = serve.deployment_snapshot(app, "hello").await? {
            for r in s.replicas {
                on.entry(r.node)
                    .or_default()
                    .push(format!("{} ({})", r.id.0, r.state));
            }
        }
        let line: Vec<String> = on
            .iter()
            .map(|(n, rs)| format!("{n}: {}", rs.join(", ")))
            .collect();
        println!("  {app:<8} {}", line.join(" | "));
    }
    Ok(())
}

async fn call_all(serve: &Serve) -> Result<(), Box<dyn std::error::Error>> {
    for app in APPS {
        let h = serve.app_handle(app)?;
        for i in 0..2 {
            let out: String = h.call(&format!("caller {i}")).await?;
            println!("  {out}");
        }
    }
    Ok(())
}

async fn head() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("flotilla-nodes-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let options = HeadOptions::new(cookie()?)
        .listen(HEAD)
        .resources(Resources::none().with_cpus(2.0));
    let serve = Serve::start(
        ServeOptions::new(registry()?)
            .store_path(dir.join("flotilla.redb"))
            .nodes(options),
    )
    .await?;
    println!("head listening for nodes at {HEAD}; waiting for nodes a and b...");
    let mut seen = 0;
    loop {
        let live = serve.metrics().await?.nodes.live;
        if live != seen {
            println!("  {live} of 2 nodes joined");
            seen = live;
        }
        if live >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for n in serve.nodes() {
        println!(
            "  node {} from {} offers {:?}",
            n.id, n.address, n.resources
        );
    }

    println!("\ndeploying 3 applications x 2 replicas of 1 CPU (head: 2 CPUs, nodes: 4 each)...");
    let mut apps: Vec<ApplicationSpec> = APPS.iter().map(|a| hello(a)).collect::<Result<_, _>>()?;
    apps.push(
        ApplicationSpec::builder("chaos")
            .route_prefix("/chaos")
            .deployment(
                DeploymentSpec::builder("chaos", "nodes::Chaos").with_config(|c| {
                    c.with_resources(Resources::none().with_custom("node:b", 1.0))
                }),
            )
            .build()?,
    );
    serve.run_many(apps, RunManyOptions::default()).await?;
    placement(&serve).await?;
    println!("\ncalling them:");
    call_all(&serve).await?;

    println!("\ncrashing node b (its chaos replica aborts the process)...");
    let killed = Instant::now();
    let crash: Result<String, _> = serve.app_handle("chaos")?.call("crash").await;
    match crash {
        Ok(_) => println!("  (the chaos call answered: node b did not crash?)"),
        Err(e) => println!("  the call in flight failed, as it must: {e}"),
    }
    while serve.metrics().await?.nodes.lost == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!("  node b declared lost after {:?}", killed.elapsed());
    // The chaos replica needs node b: nothing else can hold it.
    serve.delete_apps(["chaos"], false).await?;
    loop {
        let mut all = true;
        for app in APPS {
            let replaced = match serve.deployment_snapshot(app, "hello").await? {
                Some(s) => {
                    s.replicas.len() == 2
                        && s.replicas.iter().all(|r| {
                            !r.node.starts_with("b-") && r.state == flotilla::ReplicaState::Running
                        })
                }
                None => false,
            };
            all &= replaced && serve.app_status(app).status == ApplicationStatus::Running;
        }
        if all {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("  every replica replaced after {:?}:", killed.elapsed());
    placement(&serve).await?;
    println!("\ncalling them again:");
    call_all(&serve).await?;
    let m = serve.metrics().await?.nodes;
    println!(
        "\nnodes joined {}, lost {}, live {}; replicas on nodes {}, lost with their node {}",
        m.joined, m.lost, m.live, m.replicas_on_nodes, m.replicas_lost
    );
    serve.shutdown().await?;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
