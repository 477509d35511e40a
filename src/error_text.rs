//! An error as one line of text, with its causes.

/// `error` and its causes, each after the one it caused, on one line: `cannot
/// read x.yaml: No such file or directory (os error 2)`. A message's closing
/// period gives way to the cause; a cause whose text is already there is not
/// repeated. What a program prints for an error (`{:?}` of an error is its
/// structure, not its meaning).
///
/// ```
/// let e = std::io::Error::other("disk full");
/// assert_eq!(flotilla::with_causes(&e), "disk full");
/// ```
pub fn with_causes(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.contains(&text) {
            out.truncate(out.trim_end_matches('.').len());
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}
