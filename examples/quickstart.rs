//! Quickstart: embed Flotilla, deploy three applications (one with two deployments
//! where the ingress calls the other through a handle), call them, print a status
//! table, redeploy one, delete one and shut down.
//!
//! Run: `cargo run --release --example quickstart`

use flotilla::{
    ApplicationSpec, Deployment, DeploymentHandle, DeploymentSpec, Registry, Serve, ServeOptions,
    UserError,
};

/// Echoes requests with a greeting taken from its init args.
struct Greeter {
    greeting: String,
}

impl Deployment for Greeter {
    type Request = String;
    type Response = String;
    async fn handle(&self, name: String) -> Result<String, UserError> {
        Ok(format!("{}, {name}!", self.greeting))
    }
}

/// Upper-cases text.
struct Shout;

impl Deployment for Shout {
    type Request = String;
    type Response = String;
    async fn handle(&self, text: String) -> Result<String, UserError> {
        Ok(text.to_uppercase())
    }
}

/// The ingress of the composed application: greets, then calls `shout`.
struct Front {
    shout: DeploymentHandle,
}

impl Deployment for Front {
    type Request = String;
    type Response = String;
    async fn handle(&self, name: String) -> Result<String, UserError> {
        let loud: String = self
            .shout
            .call(&name)
            .await
            .map_err(|e| UserError::new(e.to_string()))?;
        Ok(format!("hey {loud}"))
    }
}

fn print_status(serve: &Serve) {
    println!("{:<10} {:<14} {:>4}  deployments", "app", "status", "gen");
    for (name, s) in serve.status() {
        let deps: Vec<String> = s
            .deployments
            .iter()
            .map(|(d, st)| format!("{d}={}", st.status))
            .collect();
        println!(
            "{:<10} {:<14} {:>4}  {}",
            name.as_str(),
            s.status.to_string(),
            s.observed_generation,
            deps.join(" ")
        );
    }
    println!();
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let Err(e) = run().await else {
        return std::process::ExitCode::SUCCESS;
    };
    // The error and its causes, on one line (`{:?}` is its structure).
    eprintln!("error: {}", flotilla::with_causes(e.as_ref()));
    std::process::ExitCode::FAILURE
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let registry = Registry::new()
        .register("quickstart::Greeter", |ctx| async move {
            Ok(Greeter {
                greeting: ctx.args::<String>()?,
            })
        })?
        .register("quickstart::Shout", |_ctx| async { Ok(Shout) })?
        .register("quickstart::Front", |ctx| async move {
            Ok(Front {
                shout: ctx.handle("shout")?,
            })
        })?;
    let dir = std::env::temp_dir().join(format!("flotilla-quickstart-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let serve =
        Serve::start(ServeOptions::new(registry).store_path(dir.join("flotilla.redb"))).await?;

    let greeter = |name: &str, greeting: &str, replicas| {
        ApplicationSpec::builder(name)
            .route_prefix(format!("/{name}"))
            .deployment(
                DeploymentSpec::builder("greeter", "quickstart::Greeter")
                    .init_args(greeting)
                    .replicas(replicas),
            )
            .build()
    };
    let composed = ApplicationSpec::builder("composed")
        .route_prefix("/composed")
        .deployment(DeploymentSpec::builder("front", "quickstart::Front").replicas(2))
        .deployment(DeploymentSpec::builder("shout", "quickstart::Shout").replicas(2))
        .ingress("front")
        .build()?;
    let handles = serve
        .run_many(
            vec![
                greeter("hello", "Hello", 2)?,
                greeter("bonjour", "Bonjour", 1)?,
                composed,
            ],
            Default::default(),
        )
        .await?;
    for h in &handles {
        let out: String = h.call("flotilla").await?;
        println!("{} -> {out}", h.app());
    }
    println!();
    print_status(&serve);

    println!("redeploying 'hello' with a new greeting (a code change: replicas roll)...");
    let h = serve.run(greeter("hello", "Hi there", 2)?).await?;
    let out: String = h.call("flotilla").await?;
    println!("hello -> {out}\n");

    println!("deleting 'bonjour'...");
    serve.delete_apps(&["bonjour"], true).await?;
    print_status(&serve);

    let m = serve.metrics().await?;
    println!(
        "checkpoint commits: {}, keys written: {}, bytes written: {}, replicas serving: {}",
        m.store.commits, m.store.keys_written, m.store.bytes_written, m.running_replicas
    );
    serve.shutdown().await?;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
