//! One JSON object per figure on stdout, written by hand (no serde_json needed).

use std::io::Write;

use crate::error::{BenchResult, Context};

/// A figure's value.
#[derive(Debug, Clone)]
pub enum Value {
    /// A count.
    Int(u64),
    /// A measurement.
    Num(f64),
}

impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Value::Int(v)
    }
}

impl From<usize> for Value {
    fn from(v: usize) -> Self {
        Value::Int(v as u64)
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::Num(v)
    }
}

impl Value {
    fn json(&self) -> String {
        match self {
            Value::Int(v) => v.to_string(),
            Value::Num(v) if !v.is_finite() => "null".to_owned(),
            Value::Num(v) => {
                // Six decimals, trailing zeros trimmed: readable and valid JSON.
                let s = format!("{v:.6}");
                let s = s.trim_end_matches('0').trim_end_matches('.');
                if s.is_empty() || s == "-" {
                    "0".to_owned()
                } else {
                    s.to_owned()
                }
            }
        }
    }
}

/// One figure: `{"scenario": .., "metric": .., "value": .., "unit": .., extra..}`.
#[derive(Debug, Clone)]
pub struct Figure {
    scenario: String,
    metric: String,
    value: Value,
    unit: &'static str,
    extra: Vec<(&'static str, Value)>,
}

impl Figure {
    /// A figure of `scenario`.
    pub fn new(
        scenario: impl Into<String>,
        metric: impl Into<String>,
        value: impl Into<Value>,
        unit: &'static str,
    ) -> Self {
        Figure {
            scenario: scenario.into(),
            metric: metric.into(),
            value: value.into(),
            unit,
            extra: Vec::new(),
        }
    }

    /// Add a numeric field (e.g. the size it was measured at).
    pub fn with(mut self, key: &'static str, value: impl Into<Value>) -> Self {
        self.extra.push((key, value.into()));
        self
    }

    /// The JSON line.
    pub fn json(&self) -> String {
        let mut s = format!(
            "{{\"scenario\": {}, \"metric\": {}, \"value\": {}, \"unit\": {}",
            quote(&self.scenario),
            quote(&self.metric),
            self.value.json(),
            quote(self.unit)
        );
        for (k, v) in &self.extra {
            s.push_str(&format!(", {}: {}", quote(k), v.json()));
        }
        s.push('}');
        s
    }

    /// Print it on stdout now (flushed, so a long run shows progress).
    pub fn emit(&self) -> BenchResult<()> {
        line(&self.json())
    }
}

/// Print one line on stdout and flush it.
pub fn line(text: &str) -> BenchResult<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}").context(|| "writing to stdout".to_owned())?;
    out.flush().context(|| "flushing stdout".to_owned())
}

/// A JSON string literal.
fn quote(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            '\n' => q.push_str("\\n"),
            '\r' => q.push_str("\\r"),
            '\t' => q.push_str("\\t"),
            c if (c as u32) < 0x20 => q.push_str(&format!("\\u{:04x}", c as u32)),
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

/// The number after `"key": ` in one of our own JSON lines (for parents reading
/// their children's figures).
pub fn number_field(line: &str, key: &str) -> Option<f64> {
    let pat = format!("\"{key}\": ");
    let rest = &line[line.find(&pat)? + pat.len()..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    rest[..end].trim().parse().ok()
}

/// The string after `"key": ` in one of our own JSON lines.
pub fn string_field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!("\"{key}\": \"");
    let rest = &line[line.find(&pat)? + pat.len()..];
    Some(&rest[..rest.find('"')?])
}

/// The median of `xs` (sorted in place); 0 when empty.
pub fn median(xs: &mut [f64]) -> f64 {
    percentile(xs, 0.5)
}

/// The `p` quantile (nearest rank) of `xs` (sorted in place); 0 when empty.
pub fn percentile(xs: &mut [f64], p: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(f64::total_cmp);
    let rank = ((p * xs.len() as f64).ceil() as usize).clamp(1, xs.len());
    xs[rank - 1]
}
