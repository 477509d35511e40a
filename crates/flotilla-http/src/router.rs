//! The pure longest-route-prefix matcher, with Ray's boundary rule
//! (`python/ray/serve/_private/proxy_router.py`, `match_route`): a prefix `/api`
//! matches `/api`, `/api/` and `/api/x`, never `/apix`; `/` catches every path
//! that no longer prefix matches.
//!
//! Ray tries every prefix, longest first (O(routes) per request). Route prefixes
//! never end with `/` (except `/` itself), so a prefix that matches a path by
//! Ray's rule is either the whole path or the part of it before one of its `/`s:
//! this matcher looks those up in a hash map, longest first, which costs
//! O(path segments) per request whatever the number of routes, and gives the
//! same answer (a unit test checks it against Ray's loop). Only the part of the
//! path no longer than the longest prefix is looked at: a path of 65,000
//! slashes costs what its first few bytes cost, not 65,000 hashes of ever
//! longer prefixes.

use std::collections::HashMap;

/// Route prefixes and what each leads to.
#[derive(Debug, Clone)]
pub struct PrefixRouter<T> {
    routes: HashMap<String, T>,
    /// The length of the longest prefix, in bytes.
    longest: usize,
}

impl<T> Default for PrefixRouter<T> {
    fn default() -> Self {
        PrefixRouter {
            routes: HashMap::new(),
            longest: 0,
        }
    }
}

impl<T> PrefixRouter<T> {
    /// A router over `routes` (prefix, value). A later duplicate prefix wins.
    pub fn new(routes: impl IntoIterator<Item = (String, T)>) -> Self {
        let routes: HashMap<String, T> = routes.into_iter().collect();
        let longest = routes.keys().map(String::len).max().unwrap_or(0);
        PrefixRouter { routes, longest }
    }

    /// How many prefixes it holds.
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    /// Every value.
    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.routes.values()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// The longest prefix that matches `path` by Ray's rule, and its value.
    ///
    /// ```
    /// use flotilla_http::PrefixRouter;
    /// let r = PrefixRouter::new([("/".to_owned(), 0), ("/api".to_owned(), 1)]);
    /// assert_eq!(r.route("/api/x").map(|(_, v)| *v), Some(1));
    /// assert_eq!(r.route("/apix").map(|(p, _)| p), Some("/"));
    /// ```
    pub fn route<'a>(&'a self, path: &str) -> Option<(&'a str, &'a T)> {
        if !path.starts_with('/') {
            return None;
        }
        if path.len() <= self.longest
            && let Some((k, v)) = self.routes.get_key_value(path)
        {
            return Some((k.as_str(), v));
        }
        // Each '/' after the first character ends a candidate prefix, longest
        // first; none is longer than the longest prefix.
        let bytes = path.as_bytes();
        let within = &bytes[..bytes.len().min(self.longest.saturating_add(1))];
        for i in (1..within.len()).rev().filter(|&i| within[i] == b'/') {
            // `i` is at a '/', so a char boundary.
            if let Some((k, v)) = self.routes.get_key_value(&path[..i]) {
                return Some((k.as_str(), v));
            }
        }
        self.routes.get_key_value("/").map(|(k, v)| (k.as_str(), v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ray's `ProxyRouter.match_route`, transcribed.
    fn ray_match<'a>(routes: &'a [&'a str], target: &str) -> Option<&'a str> {
        let mut sorted: Vec<&str> = routes.to_vec();
        sorted.sort_by_key(|r| std::cmp::Reverse(r.len()));
        for route in sorted {
            if target.starts_with(route) {
                let matched = route.ends_with('/')
                    || target.len() == route.len()
                    || target.as_bytes()[route.len()] == b'/';
                if matched {
                    return Some(route);
                }
            }
        }
        None
    }

    fn router(routes: &[&str]) -> PrefixRouter<()> {
        PrefixRouter::new(routes.iter().map(|r| ((*r).to_owned(), ())))
    }

    #[test]
    fn the_longest_prefix_wins_on_segment_boundaries_only() {
        let r = router(&["/a", "/a/b", "/api"]);
        let m = |p: &str| r.route(p).map(|(k, _)| k.to_owned());
        assert_eq!(m("/a").as_deref(), Some("/a"));
        assert_eq!(m("/a/").as_deref(), Some("/a"));
        assert_eq!(m("/a/c").as_deref(), Some("/a"));
        assert_eq!(m("/a/b").as_deref(), Some("/a/b"));
        assert_eq!(m("/a/b/").as_deref(), Some("/a/b"));
        assert_eq!(m("/a/b/c/d").as_deref(), Some("/a/b"));
        assert_eq!(m("/a/bc").as_deref(), Some("/a"));
        assert_eq!(m("/ab"), None);
        assert_eq!(m("/apix"), None);
        assert_eq!(m("/api/x").as_deref(), Some("/api"));
        assert_eq!(m("/"), None);
        assert_eq!(m("*"), None);
    }

    #[test]
    fn root_catches_what_nothing_else_matches() {
        let r = router(&["/", "/api"]);
        let m = |p: &str| r.route(p).map(|(k, _)| k.to_owned());
        assert_eq!(m("/").as_deref(), Some("/"));
        assert_eq!(m("/apix").as_deref(), Some("/"));
        assert_eq!(m("/api").as_deref(), Some("/api"));
        assert_eq!(m("//api").as_deref(), Some("/"));
        assert_eq!(m("*"), None, "not a path");
        assert!(router(&[]).route("/").is_none());
    }

    #[test]
    fn a_path_longer_than_every_prefix_matches_as_in_rays_loop() {
        let set: &[&str] = &["/", "/a", "/a/b", "/api/v1"];
        let r = router(set);
        let slashes = "/".repeat(65_000);
        for path in [
            slashes.clone(),
            format!("/a{slashes}"),
            format!("/a/b{slashes}x"),
            format!("/api/v1/{}", "é".repeat(1_000)),
            format!("/api/v1é{slashes}"),
            format!("/a/bé/{slashes}"),
        ] {
            assert_eq!(r.route(&path).map(|(k, _)| k), ray_match(set, &path));
        }
    }

    #[test]
    fn agrees_with_rays_loop_on_many_paths() {
        let routes = ["/", "/a", "/a/b", "/ab", "/a//b", "/x/y/z", "/x"];
        let parts = ["/", "a", "b", "ab", "x", "y", "z", "//", "c"];
        // Every path of these parts up to 6 bytes, against several route sets.
        let sets: [&[&str]; 4] = [&routes, &routes[1..], &["/a/b"], &["/", "/x/y/z"]];
        for set in sets {
            let r = router(set);
            let mut n = 0u32;
            let mut stack = vec![String::from("/")];
            while let Some(path) = stack.pop() {
                assert_eq!(
                    r.route(&path).map(|(k, _)| k),
                    ray_match(set, &path),
                    "path {path:?} over {set:?}"
                );
                n += 1;
                if path.len() < 6 {
                    for p in parts {
                        stack.push(format!("{path}{p}"));
                    }
                }
            }
            assert!(n > 1000);
        }
    }
}
