//! The one rule every secret Flotilla reads obeys: the REST API's bearer
//! token (server and CLI) and the nodes' cookie, whether from a file, an
//! environment variable or code; and how long one guarding a listener off
//! loopback must be.

/// The longest secret taken, in bytes (after trimming).
pub const MAX_SECRET_LEN: usize = 4096;

/// The shortest secret that may guard a listener off loopback, in bytes.
/// A shorter one falls to guessing: the REST API answers every wrong token,
/// and a node cookie's challenge crosses the network in plaintext, so one
/// handshake seen is enough to try cookies offline.
pub const MIN_EXPOSED_SECRET_LEN: usize = 16;

/// Whether `secret` is long enough to guard a listener off loopback
/// ([`MIN_EXPOSED_SECRET_LEN`]; on loopback any secret does).
///
/// ```
/// use flotilla_core::exposable;
/// assert!(!exposable("s3cret"));
/// assert!(exposable("7f3a9c0e5b2d4f61a8e3"));
/// ```
pub fn exposable(secret: &str) -> bool {
    secret.len() >= MIN_EXPOSED_SECRET_LEN
}

/// Why a text holds no usable secret. Callers say which secret and where it
/// was read from; this says what is wrong with the text (never the text).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// Nothing but whitespace.
    #[error("it is empty")]
    Empty,
    /// A line break (a second line) or another control character inside it:
    /// taking only the first line would make a secret that no one sending
    /// the whole file could match, silently.
    #[error("it holds a line break or another control character: a secret is one line of text")]
    NotOneLine,
    /// Longer than [`MAX_SECRET_LEN`].
    #[error("it is longer than {MAX_SECRET_LEN} bytes")]
    TooLong,
}

/// The secret in `text`: `text` with surrounding whitespace trimmed (a file's
/// final newline goes), which must be non-empty, one line without control
/// characters, and at most [`MAX_SECRET_LEN`] bytes.
///
/// ```
/// use flotilla_core::{SecretError, secret_from_text};
/// assert_eq!(secret_from_text("  s3cret\n"), Ok("s3cret"));
/// assert_eq!(secret_from_text("\n"), Err(SecretError::Empty));
/// assert_eq!(secret_from_text("s3cret\n# rotated\n"), Err(SecretError::NotOneLine));
/// ```
pub fn secret_from_text(text: &str) -> Result<&str, SecretError> {
    let secret = text.trim();
    if secret.is_empty() {
        return Err(SecretError::Empty);
    }
    if secret.chars().any(char::is_control) {
        return Err(SecretError::NotOneLine);
    }
    if secret.len() > MAX_SECRET_LEN {
        return Err(SecretError::TooLong);
    }
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_one_trimmed_line_of_bounded_length() {
        assert_eq!(secret_from_text("abc"), Ok("abc"));
        assert_eq!(secret_from_text("\t a b \r\n"), Ok("a b"));
        assert_eq!(secret_from_text(""), Err(SecretError::Empty));
        assert_eq!(secret_from_text(" \n\t"), Err(SecretError::Empty));
        assert_eq!(secret_from_text("a\nb"), Err(SecretError::NotOneLine));
        assert_eq!(secret_from_text("a\r\nb\n"), Err(SecretError::NotOneLine));
        assert_eq!(secret_from_text("a\tb"), Err(SecretError::NotOneLine));
        assert_eq!(secret_from_text("a\u{0}b"), Err(SecretError::NotOneLine));
        let long = "x".repeat(MAX_SECRET_LEN);
        assert_eq!(secret_from_text(&long), Ok(long.as_str()));
        assert_eq!(
            secret_from_text(&format!("{long}x")),
            Err(SecretError::TooLong)
        );
    }
}
