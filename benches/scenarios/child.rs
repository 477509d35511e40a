//! Running a scenario in a child process of this same binary, so each scenario
//! measures a fresh process (memory, idle CPU and leftover actors do not mix).

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
};

use crate::{
    error::{BenchError, BenchResult, Context},
    report,
};

/// Run this program (`scenarios ARGS...`) again, echo its figures on our stdout as they come, and
/// return them.
pub async fn run(args: Vec<String>) -> BenchResult<Vec<String>> {
    tokio::task::spawn_blocking(move || run_blocking(&args))
        .await
        .context(|| "joining the child runner".to_owned())?
}

fn run_blocking(args: &[String]) -> BenchResult<Vec<String>> {
    let exe = std::env::current_exe().context(|| "finding this executable".to_owned())?;
    let shown = args.join(" ");
    let mut child = Command::new(&exe)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context(|| format!("starting {} {shown}", exe.display()))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| BenchError::msg("the child has no stdout"))?;
    let mut lines = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.context(|| format!("reading the output of {shown}"))?;
        report::line(&line)?;
        lines.push(line);
    }
    let status = child.wait().context(|| format!("waiting for {shown}"))?;
    if !status.success() {
        return Err(BenchError::msg(format!("`{shown}` failed: {status}")));
    }
    Ok(lines)
}
