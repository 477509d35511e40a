//! `flotilla`: a client of Flotilla's REST API, as Ray's `serve` CLI is of Ray's.
//!
//! ```text
//! flotilla deploy FILE            apply a ServeConfig (YAML or JSON)
//! flotilla status [-o FORMAT]     applications and deployments (table, json or yaml)
//! flotilla config [-n NAME]       the applied config, as YAML
//! flotilla delete [-y]            delete every application
//! ```
//!
//! `--address` (default `http://127.0.0.1:8265`, or `FLOTILLA_ADDRESS`) and
//! `--token-file` (or `FLOTILLA_TOKEN_FILE`) apply to every command. An error
//! from the server is printed as the server wrote it, and the exit status is 1.
//! The token is read and sent only by deploy and delete, and a warning goes to
//! stderr when it would cross the network in plain HTTP (an address off
//! loopback).

mod client;
mod output;

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand, ValueEnum};

use client::{Client, ClientError};

/// CLI for managing Flotilla applications through the Serve REST API.
#[derive(Debug, Parser)]
#[command(name = "flotilla", version)]
struct Cli {
    /// The REST API's address.
    #[arg(
        short,
        long,
        global = true,
        env = "FLOTILLA_ADDRESS",
        default_value = "http://127.0.0.1:8265"
    )]
    address: String,
    /// A file holding the bearer token for deploy and delete.
    #[arg(long, global = true, env = "FLOTILLA_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

/// How `status` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    /// A table for people.
    Table,
    /// Ray's `ServeStatus`, as JSON.
    Json,
    /// Ray's `ServeStatus`, as YAML (what `serve status` prints).
    Yaml,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Apply a config file (Ray Serve's format): the applications it names run,
    /// declarative applications it does not name are deleted.
    Deploy {
        /// The config file (YAML, or JSON).
        config: PathBuf,
    },
    /// Show every application's status, its deployments' and their replicas'.
    Status {
        /// Output format.
        #[arg(short, long, value_enum, default_value = "table")]
        output: Format,
        /// Only this application.
        #[arg(short, long)]
        name: Option<String>,
    },
    /// Print the applied config of each application deployed by config.
    Config {
        /// Only this application.
        #[arg(short, long)]
        name: Option<String>,
    },
    /// Delete every application.
    Delete {
        /// Do not ask for confirmation.
        #[arg(short, long)]
        yes: bool,
    },
}

impl Command {
    /// Whether the command changes state, and so sends the bearer token.
    fn sends_token(&self) -> bool {
        matches!(self, Command::Deploy { .. } | Command::Delete { .. })
    }
}

/// The client for `cli`'s command: the token file is read (and a plaintext
/// warning due) only for the commands that send the token.
fn client(cli: &Cli) -> Result<Client, ClientError> {
    let client = Client::new(&cli.address)?;
    match &cli.token_file {
        Some(path) if cli.command.sends_token() => client.with_token_file(path),
        _ => Ok(client),
    }
}

async fn run(cli: Cli) -> Result<(), ClientError> {
    let client = client(&cli)?;
    if let Some(warning) = client.plaintext_warning() {
        tell(&format!("{warning}\n"));
    }
    match cli.command {
        Command::Deploy { config } => {
            let text = read_config(&config)?;
            say(&format!(
                "Deploying from config file: '{}'.\n",
                config.display()
            ))?;
            let content_type = match config.extension().and_then(|e| e.to_str()) {
                Some("json") => "application/json",
                _ => "application/yaml",
            };
            let warnings = client.put_config(text, content_type).await?;
            tell(&warnings);
            say(
                "\nSent deploy request successfully.\n * Use `flotilla status` to check applications' statuses.\n * Use `flotilla config` to see the current application config(s).\n\n",
            )?;
        }
        Command::Status { output, name } => {
            let details = client.details().await?;
            say(&output::status(&details, output, name.as_deref())?)?;
        }
        Command::Config { name } => {
            let details = client.details().await?;
            say(&output::config(&details, name.as_deref())?)?;
        }
        Command::Delete { yes } => {
            if !yes && !confirm(&cli.address)? {
                return Err(ClientError::Aborted);
            }
            // The server answers once every application is gone, or after 30
            // s while some still drain: say which.
            client.delete().await?;
            // The deletion is committed: a failed look at what is left is
            // said, not an error (a script would delete again for nothing).
            match client.details().await {
                Ok(details) => match details["applications"].as_object().map_or(0, |a| a.len()) {
                    0 => say("Deleted every application.\n")?,
                    n => say(&format!(
                        "Sent delete request; {n} application(s) are still being deleted (see `flotilla status`).\n"
                    ))?,
                },
                Err(e) => say(&format!(
                    "Sent delete request successfully; could not see what is left ({e}): see `flotilla status`.\n"
                ))?,
            }
        }
    }
    Ok(())
}

/// Write `text` to standard output. A reader that went away first (`|
/// head`) is not an error: there is nobody left to tell. Any other failure
/// is.
fn say(text: &str) -> Result<(), ClientError> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(ClientError::Terminal(e)),
        _ => Ok(()),
    }
}

/// Write `text` to standard error, if anyone reads it.
fn tell(text: &str) {
    use std::io::Write;
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// Ask before deleting everything, as click's `confirm` asks: `y` or `yes`
/// (any case) goes on; `n`, `no` or an empty line does not; anything else is
/// asked again; input that ends is a no.
fn confirm(address: &str) -> Result<bool, ClientError> {
    let prompt = format!(
        "This will delete every application of the Flotilla instance at \"{address}\". Do you want to continue? [y/N]: "
    );
    let mut stdin = std::io::stdin().lock();
    loop {
        say(&prompt)?;
        let mut line = String::new();
        let read =
            std::io::BufRead::read_line(&mut stdin, &mut line).map_err(ClientError::Terminal)?;
        if read == 0 || !line.ends_with('\n') {
            // The input ended (Ctrl-D, none, or a last line without one): no
            // answer's newline ends the prompt's line.
            say("\n")?;
            return Ok(false);
        }
        match line.trim().to_lowercase().as_str() {
            "y" | "yes" => return Ok(true),
            "" | "n" | "no" => return Ok(false),
            _ => say("Error: invalid input\n")?,
        }
    }
}

/// The config file's bytes, at most what the server takes
/// ([`flotilla::MAX_CONFIG_FILE_BYTES`]): any file that reads, a regular file
/// or a pipe (`deploy <(envsubst < serve.yaml)`, as Ray's `serve deploy`
/// reads one), never more than the limit (a device that never ends).
fn read_config(path: &std::path::Path) -> Result<Vec<u8>, ClientError> {
    use std::io::Read;
    let limit = flotilla::MAX_CONFIG_FILE_BYTES;
    let io = |source| ClientError::ReadFile {
        path: path.to_owned(),
        source,
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .map_err(io)?
        .take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > limit {
        return Err(ClientError::ConfigTooLarge {
            path: path.to_owned(),
            limit,
        });
    }
    Ok(bytes)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            tell(&format!("Error: cannot start the async runtime: {e}\n"));
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tell(&format!("Error: {}\n", flotilla::with_causes(&e)));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn parse(token_file: &Path, command: &[&str]) -> Cli {
        let mut args = vec![
            "flotilla".to_owned(),
            "--address".to_owned(),
            "http://10.0.0.5:8265".to_owned(),
            "--token-file".to_owned(),
            token_file.display().to_string(),
        ];
        args.extend(command.iter().map(|s| (*s).to_owned()));
        Cli::try_parse_from(args).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn an_error_is_printed_with_its_causes() {
        let e = ClientError::ReadFile {
            path: "x.yaml".into(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
        };
        assert_eq!(
            flotilla::with_causes(&e),
            "cannot read x.yaml: no such file"
        );
        assert_eq!(flotilla::with_causes(&ClientError::Aborted), "aborted");
        /// A message that ends in a period.
        #[derive(Debug, thiserror::Error)]
        #[error("outer.")]
        struct Period(#[source] ClientError);
        let e = Period(ClientError::Terminal(std::io::Error::other("inner")));
        assert_eq!(
            flotilla::with_causes(&e),
            "outer: terminal I/O failed: inner"
        );
        /// A message that already holds its cause's text.
        #[derive(Debug, thiserror::Error)]
        #[error("outer: {0}")]
        struct Embeds(#[source] std::io::Error);
        let e = Embeds(std::io::Error::other("inner"));
        assert_eq!(flotilla::with_causes(&e), "outer: inner");
    }

    #[test]
    fn only_deploy_and_delete_read_the_token_and_warn_about_it() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let token = dir.path().join("token");
        std::fs::write(&token, "t0ken\n").unwrap_or_else(|e| panic!("{e}"));
        let missing = dir.path().join("missing");
        for reads in [&["status"][..], &["status", "-o", "json"], &["config"]] {
            let c = client(&parse(&missing, reads)).unwrap_or_else(|e| panic!("{reads:?}: {e}"));
            assert_eq!(c.plaintext_warning(), None, "{reads:?}");
            let c = client(&parse(&token, reads)).unwrap_or_else(|e| panic!("{reads:?}: {e}"));
            assert_eq!(c.plaintext_warning(), None, "{reads:?}");
        }
        for mutates in [&["deploy", "c.yaml"][..], &["delete", "-y"]] {
            let e = client(&parse(&missing, mutates)).err();
            assert!(
                matches!(&e, Some(ClientError::ReadFile { path, .. }) if *path == missing),
                "{mutates:?}: {e:?}"
            );
            let c = client(&parse(&token, mutates)).unwrap_or_else(|e| panic!("{mutates:?}: {e}"));
            assert!(
                c.plaintext_warning()
                    .is_some_and(|w| w.contains("unencrypted")),
                "{mutates:?}"
            );
        }
    }
}
