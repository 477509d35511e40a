//! Process figures from /proc: resident memory and CPU time.

use crate::error::{BenchError, BenchResult, Context};

/// Clock ticks per second of /proc/*/stat times (`USER_HZ`, 100 on Linux's ABI).
const USER_HZ: f64 = 100.0;

/// Resident set size in bytes (`VmRSS` of /proc/self/status).
pub fn rss_bytes() -> BenchResult<u64> {
    let status = std::fs::read_to_string("/proc/self/status")
        .context(|| "reading /proc/self/status".to_owned())?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .ok_or_else(|| BenchError::msg("/proc/self/status has no VmRSS line"))?;
    let kib: u64 = line
        .trim_start_matches("VmRSS:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .context(|| format!("parsing {line:?}"))?;
    Ok(kib * 1024)
}

/// User plus system CPU seconds of the whole process, every thread included
/// (fields 14 and 15 of /proc/self/stat).
pub fn cpu_seconds() -> BenchResult<f64> {
    let (user, system) = cpu_split()?;
    Ok(user + system)
}

/// User and system CPU seconds of the whole process, apart.
pub fn cpu_split() -> BenchResult<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/self/stat")
        .context(|| "reading /proc/self/stat".to_owned())?;
    // The command name may hold spaces: fields are counted after its ')'.
    let after = stat
        .rfind(')')
        .map(|i| &stat[i + 1..])
        .ok_or_else(|| BenchError::msg("/proc/self/stat has no ')'"))?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After ')' field 3 (state) is index 0, so utime (14) is 11 and stime (15) is 12.
    let tick = |i: usize| -> BenchResult<f64> {
        fields
            .get(i)
            .ok_or_else(|| BenchError::msg("/proc/self/stat is too short"))?
            .parse::<u64>()
            .map(|t| t as f64 / USER_HZ)
            .context(|| format!("parsing field {} of /proc/self/stat", i + 3))
    };
    Ok((tick(11)?, tick(12)?))
}
