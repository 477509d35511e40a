//! Validated names: applications, deployments, route prefixes and import paths.
//!
//! Each is a newtype that can only hold a valid value: construction and
//! deserialisation both validate, so a name read back from a checkpoint is as
//! trustworthy as one typed by a user.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Location, shown};

/// Longest application or deployment name, in bytes.
pub const MAX_NAME_LEN: usize = 128;
/// Longest route prefix or import path, in bytes.
pub const MAX_PATH_LEN: usize = 512;

fn invalid(what: &'static str, value: &str, reason: &'static str) -> Error {
    Error::InvalidName {
        at: Location::default(),
        what,
        value: shown(value),
        reason,
    }
}

fn check_name(what: &'static str, s: &str) -> Result<(), Error> {
    if s.is_empty() {
        return Err(invalid(what, s, "must not be empty"));
    }
    if s.len() > MAX_NAME_LEN {
        return Err(invalid(what, s, "must be at most 128 bytes"));
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
    {
        return Err(invalid(
            what,
            s,
            "may hold only letters, digits, '_', '.' and '-'",
        ));
    }
    Ok(())
}

macro_rules! validated_name {
    ($(#[$doc:meta])* $ty:ident, $what:literal, $check:path) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $ty(String);

        impl $ty {
            /// Validate `s` and wrap it.
            pub fn new(s: impl Into<String>) -> Result<Self, Error> {
                let s = s.into();
                let s = $check($what, s)?;
                Ok(Self(s))
            }

            /// The name as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// A value this crate knows to be valid (a constant such as Ray's
            /// default policy path); checked in debug builds.
            #[allow(dead_code)]
            pub(crate) fn known(s: &'static str) -> Self {
                debug_assert!($check($what, s.to_owned()).is_ok(), "{s}");
                Self(s.to_owned())
            }
        }

        impl TryFrom<String> for $ty {
            type Error = Error;
            fn try_from(s: String) -> Result<Self, Error> {
                Self::new(s)
            }
        }

        impl TryFrom<&str> for $ty {
            type Error = Error;
            fn try_from(s: &str) -> Result<Self, Error> {
                Self::new(s)
            }
        }

        impl From<$ty> for String {
            fn from(n: $ty) -> String {
                n.0
            }
        }

        impl AsRef<str> for $ty {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $ty {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }
    };
}

fn plain_name(what: &'static str, s: String) -> Result<String, Error> {
    check_name(what, &s)?;
    Ok(s)
}

/// Ray's rules (`schema.py`), checked, never normalised: a leading `/`, no
/// trailing `/` but for the root, no wildcard braces; and, since a prefix is
/// matched against request paths, nothing a path cannot hold (whitespace, control
/// characters, `?`, `#`).
fn route_prefix(what: &'static str, s: String) -> Result<String, Error> {
    if !s.starts_with('/') {
        return Err(invalid(what, &s, "must start with '/'"));
    }
    if s.len() > MAX_PATH_LEN {
        return Err(invalid(what, &s, "must be at most 512 bytes"));
    }
    if s.len() > 1 && s.ends_with('/') {
        return Err(invalid(
            what,
            &s,
            "must not end with '/' (except the root \"/\")",
        ));
    }
    if s.contains(['{', '}']) {
        return Err(invalid(
            what,
            &s,
            "must not contain wildcards ('{' and '}')",
        ));
    }
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(invalid(
            what,
            &s,
            "must not contain whitespace or control characters",
        ));
    }
    if s.contains(['?', '#']) {
        return Err(invalid(
            what,
            &s,
            "must not contain '?' or '#' (a request path never holds them)",
        ));
    }
    Ok(s)
}

fn import_path(what: &'static str, s: String) -> Result<String, Error> {
    if s.is_empty() {
        return Err(invalid(what, &s, "must not be empty"));
    }
    if s.len() > MAX_PATH_LEN {
        return Err(invalid(what, &s, "must be at most 512 bytes"));
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-' | b'/'))
    {
        return Err(invalid(
            what,
            &s,
            "may hold only letters, digits and '_', '.', ':', '-', '/'",
        ));
    }
    Ok(s)
}

validated_name!(
    /// An application's name: non-empty, at most 128 bytes of letters, digits, `_ . -`.
    ///
    /// ```
    /// use flotilla_core::AppName;
    /// assert!(AppName::new("shop-v2").is_ok());
    /// assert!(AppName::new("no spaces").is_err());
    /// ```
    AppName,
    "application name",
    plain_name
);
validated_name!(
    /// A deployment's name, unique within its application; same rules as [`AppName`].
    DeploymentName,
    "deployment name",
    plain_name
);
validated_name!(
    /// An HTTP route prefix, validated as Ray Serve validates it (never normalised):
    /// starts with `/`, no trailing `/` except the root `/`, no `{` or `}`, and no
    /// whitespace, control characters, `?` or `#`.
    ///
    /// ```
    /// use flotilla_core::RoutePrefix;
    /// assert_eq!(RoutePrefix::new("/api").unwrap().as_str(), "/api");
    /// assert!(RoutePrefix::new("/api/").is_err());
    /// ```
    RoutePrefix,
    "route prefix",
    route_prefix
);
validated_name!(
    /// The name under which code is registered in the `Registry`, e.g. `"echo::Echo"`.
    ImportPath,
    "import path",
    import_path
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_accept_the_allowed_alphabet() {
        for ok in ["a", "A-b_c.d", "0", &"x".repeat(128)] {
            assert!(AppName::new(ok).is_ok(), "{ok}");
            assert!(DeploymentName::new(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn names_reject_empty_long_and_odd_characters() {
        for bad in ["", "a b", "a/b", "é", "a\n", &"x".repeat(129)] {
            let err = AppName::new(bad).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::InvalidName {
                        what: "application name",
                        ..
                    }
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn route_prefix_rules() {
        for ok in ["/", "/a", "/a/b-c", "/v1.2", "/a//b", "/%7Bx%7D"] {
            assert!(RoutePrefix::new(ok).is_ok(), "{ok}");
        }
        for bad in [
            "", "a", "api/", " /a", "/a/", "//", "/a b", "/a\tb", "/a\u{7}", "/a?x", "/a#x",
            "/{id}", "/a}",
        ] {
            assert!(RoutePrefix::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn import_paths() {
        assert!(ImportPath::new("echo::Echo").is_ok());
        assert!(ImportPath::new("pkg.module:app").is_ok());
        assert!(ImportPath::new("").is_err());
        assert!(ImportPath::new("a b").is_err());
    }

    #[test]
    fn deserialisation_validates() {
        let bytes = rmp_serde::to_vec(&"bad name").unwrap();
        assert!(rmp_serde::from_slice::<AppName>(&bytes).is_err());
        let bytes = rmp_serde::to_vec(&AppName::new("good").unwrap()).unwrap();
        assert_eq!(
            rmp_serde::from_slice::<AppName>(&bytes).unwrap().as_str(),
            "good"
        );
    }
}
