//! Bearer tokens for the REST API's mutating endpoints.
//!
//! The rule: when a token is configured, `PUT` and `DELETE` need
//! `Authorization: Bearer <token>` (else 401); when none is configured, both
//! listeners must be on loopback ([`HttpServer::start`](crate::HttpServer::start)
//! refuses anything else). Reads (`GET`, `/metrics`) never need it, as Ray's
//! dashboard. The token is read once at start, compared in constant time, and
//! never logged or shown by `Debug`.
//!
//! Whatever the token, a mutation that looks like it comes from a browser is
//! refused with 405, as Ray's dashboard refuses it
//! (`ray._private.browser_request`): a web page can make a browser send a
//! request to a loopback listener (cross-site, or through DNS rebinding), and
//! Flotilla's clients are programs, never pages.

use std::{fmt, path::PathBuf};

use http::HeaderMap;

use subtle::ConstantTimeEq;

use crate::HttpError;

/// Where the bearer token comes from.
#[derive(Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// A file holding the token on one line (surrounding whitespace is
    /// trimmed; a second line is refused).
    File(PathBuf),
    /// An environment variable holding the token.
    Env(String),
    /// The token itself (for programs that have it from elsewhere, and tests).
    Literal(String),
}

impl fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenSource::File(p) => f.debug_tuple("File").field(p).finish(),
            TokenSource::Env(v) => f.debug_tuple("Env").field(v).finish(),
            TokenSource::Literal(_) => f.write_str("Literal(<redacted>)"),
        }
    }
}

/// A loaded token (its bytes never printed).
#[derive(Clone)]
pub(crate) struct Token(Vec<u8>);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Token {
    /// Read the token from `source`, by the rule every Flotilla secret obeys
    /// ([`secret_from_text`](flotilla::secret_from_text): one line, trimmed).
    pub(crate) fn load(source: &TokenSource) -> Result<Token, HttpError> {
        let (text, source_name) = match source {
            TokenSource::File(path) => (
                std::fs::read_to_string(path).map_err(|source| HttpError::TokenFile {
                    path: path.clone(),
                    source,
                })?,
                format!("file {}", path.display()),
            ),
            TokenSource::Env(var) => (
                std::env::var(var).map_err(|source| HttpError::TokenEnv {
                    var: var.clone(),
                    source,
                })?,
                format!("environment variable {var}"),
            ),
            TokenSource::Literal(t) => (t.clone(), "the literal token".to_owned()),
        };
        let token = flotilla::secret_from_text(&text).map_err(|source| HttpError::BadToken {
            source_name,
            source,
        })?;
        Ok(Token(token.as_bytes().to_vec()))
    }

    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether an `Authorization` header value carries this token
    /// (`Bearer <token>`, the scheme case-insensitive).
    pub(crate) fn accepts(&self, authorization: Option<&[u8]>) -> bool {
        let Some(value) = authorization else {
            return false;
        };
        let Some(scheme) = value.get(..7) else {
            return false;
        };
        if !scheme.eq_ignore_ascii_case(b"bearer ") {
            return false;
        }
        let given = value[7..].trim_ascii();
        given.ct_eq(&self.0).into()
    }
}

/// Ray's best-effort test for a request a browser sent: a `User-Agent`
/// starting `Mozilla` (which scripts in a page cannot change), or any of the
/// headers browsers add and programs do not (`Referer`, `Origin`,
/// `Sec-Fetch-*`, the CORS preflight's `Access-Control-Request-*`).
pub(crate) fn is_browser_request(headers: &HeaderMap) -> bool {
    const BROWSER_HEADERS: [&str; 8] = [
        "referer",
        "origin",
        "sec-fetch-mode",
        "sec-fetch-dest",
        "sec-fetch-site",
        "sec-fetch-user",
        "access-control-request-method",
        "access-control-request-headers",
    ];
    headers
        .get(http::header::USER_AGENT)
        .is_some_and(|ua| ua.as_bytes().starts_with(b"Mozilla"))
        || BROWSER_HEADERS.iter().any(|h| headers.contains_key(*h))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn only_the_exact_bearer_token_is_accepted() {
        let t = Token::load(&TokenSource::Literal(" s3cret \n".into())).unwrap();
        assert!(t.accepts(Some(b"Bearer s3cret")));
        assert!(t.accepts(Some(b"bearer s3cret")));
        assert!(!t.accepts(Some(b"Bearer s3cre")));
        assert!(!t.accepts(Some(b"Bearer s3cretx")));
        assert!(!t.accepts(Some(b"Basic s3cret")));
        assert!(!t.accepts(Some(b"Bearer")));
        assert!(!t.accepts(None));
        assert_eq!(format!("{t:?}"), "Token(<redacted>)");
        assert!(!format!("{:?}", TokenSource::Literal("s3cret".into())).contains("s3cret"));
    }

    #[test]
    fn an_empty_source_is_an_error_naming_it_not_the_token() {
        let e = Token::load(&TokenSource::Env("FLOTILLA_TEST_UNSET_TOKEN_VAR".into())).unwrap_err();
        assert!(
            e.to_string().contains("FLOTILLA_TEST_UNSET_TOKEN_VAR"),
            "{e}"
        );
        assert!(matches!(e, HttpError::TokenEnv { .. }), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none");
        let e = Token::load(&TokenSource::File(missing)).unwrap_err();
        assert!(matches!(e, HttpError::TokenFile { .. }), "{e}");
        let file = dir.path().join("token");
        std::fs::write(&file, " \n").unwrap();
        let e = Token::load(&TokenSource::File(file.clone())).unwrap_err();
        assert!(
            matches!(
                &e,
                HttpError::BadToken {
                    source: flotilla::SecretError::Empty,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn a_token_file_of_two_lines_is_refused_not_cut_to_one() {
        // Its whole text as one token (the rule before) matched no header:
        // every PUT and DELETE was refused with nothing saying why.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "t0k3n\n# rotated 2026-12\n").unwrap();
        let e = Token::load(&TokenSource::File(file.clone())).unwrap_err();
        assert!(
            matches!(
                &e,
                HttpError::BadToken {
                    source: flotilla::SecretError::NotOneLine,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains(&file.display().to_string()), "{e}");
        assert!(!e.to_string().contains("t0k3n"), "{e}");
        std::fs::write(&file, "t0k3n\n").unwrap();
        let t = Token::load(&TokenSource::File(file)).unwrap();
        assert!(t.accepts(Some(b"Bearer t0k3n")));
    }
}
