//! Better messages for two mistakes: a misspelt field (the error names the
//! nearest known one, by edit distance), and Ray's old single-application format.

/// Fields Ray had and removed, or has elsewhere: `(field, a field known where it
/// was found, hint)`. The second element tells which struct the unknown field
/// was found in, from the list of fields that struct knows.
const HINTS: &[(&str, &str, &str)] = &[
    (
        "route_prefix",
        "num_replicas",
        "a deployment's route_prefix was removed from Ray in 2.20: set route_prefix on the \
         application",
    ),
    (
        "import_path",
        "num_replicas",
        "a deployment's code comes from the application's builder (Ray 1.x's deployment \
         import_path is gone)",
    ),
    (
        "init_args",
        "num_replicas",
        "init args come from the application's builder, which takes the application's `args`",
    ),
    (
        "init_kwargs",
        "num_replicas",
        "init args come from the application's builder, which takes the application's `args`",
    ),
    (
        "placement_group_fallback_strategy",
        "num_replicas",
        "Ray's schema has no such field either",
    ),
    (
        "object_store_memory",
        "num_cpus",
        "Ray's schema no longer has it, and Flotilla has no object store",
    ),
    (
        "location",
        "root_path",
        "the proxies' location is the top-level proxy_location",
    ),
    (
        "num_cpus",
        "root_path",
        "the HTTP proxy runs in this process and reserves no resources",
    ),
    (
        "name",
        "policy_kwargs",
        "this is the old shape of `policy`: write `policy_function: <path>`",
    ),
    (
        "pip",
        "env_vars",
        "controller_options.runtime_env takes only env_vars (as in Ray)",
    ),
    (
        "working_dir",
        "env_vars",
        "controller_options.runtime_env takes only env_vars (as in Ray)",
    ),
];

/// The longest unknown name a suggestion is looked for (no field of Ray's
/// schema is near this long; the distance costs its length times theirs).
const SUGGEST_MAX_LEN: usize = 64;

/// The nearest of `known` to `unknown` by Damerau-Levenshtein distance, if near
/// enough to be a typo (at most 2 edits, or a third of the name). Names whose
/// lengths differ by more than that are not compared (their distance is at
/// least the difference), and a name over [`SUGGEST_MAX_LEN`] is no typo.
pub(super) fn nearest<'a>(unknown: &str, known: &[&'a str]) -> Option<&'a str> {
    let len = unknown.chars().count();
    if len > SUGGEST_MAX_LEN {
        return None;
    }
    let limit = (len / 3).max(2);
    known
        .iter()
        .filter(|k| k.chars().count().abs_diff(len) <= limit)
        .map(|k| (strsim::damerau_levenshtein(unknown, k), *k))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// A parser message about an unknown field, rewritten to name the nearest
/// known field (or a hint for a field Ray removed); `None` if `message` is not
/// about an unknown field.
///
/// The parser says `unknown field `x`, expected one of a, b, c` (or
/// `expected a`, or `there are no fields`).
pub(super) fn unknown_field(message: &str) -> Option<String> {
    let rest = message.strip_prefix("unknown field `")?;
    // The name may hold a backtick itself: it ends at the last "`," (or the
    // last backtick).
    let (field, rest) = match rest.rfind("`,") {
        Some(at) => (&rest[..at], &rest[at + 1..]),
        None => rest.rsplit_once('`')?,
    };
    let known: Vec<&str> = match rest.trim_start_matches(',').trim() {
        r if r.starts_with("expected one of ") => r["expected one of ".len()..]
            .split(", ")
            .map(|k| k.trim_matches('`'))
            .collect(),
        r if r.starts_with("expected ") => vec![r["expected ".len()..].trim_matches('`')],
        _ => Vec::new(),
    };
    let hint = HINTS
        .iter()
        .find(|(f, marker, _)| *f == field && known.contains(marker))
        .map(|(_, _, h)| *h);
    let what = if let Some(h) = hint {
        format!("; {h}")
    } else if let Some(n) = nearest(field, &known) {
        format!("; did you mean `{n}`?")
    } else if known.is_empty() {
        String::new()
    } else {
        format!("; known fields here: {}", known.join(", "))
    };
    Some(format!(
        "unknown field `{}` (not in Ray Serve's config schema){what}",
        crate::shown(field)
    ))
}

/// The error for Ray's single-application format, before `applications:`.
pub(super) const SINGLE_APP: &str = "this is Ray's old single-application config format (a \
     top-level import_path): wrap the application in a list under `applications:`, as Ray's \
     multi-application format does, e.g.\n  applications:\n    - name: default\n      \
     import_path: ...\n      deployments: [...]\n(`runtime_env`, `args` and `deployments` \
     move into the application; `host` and `port` become http_options.host and \
     http_options.port)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_name_the_nearest_field() {
        let m = unknown_field("unknown field `num_replica`, expected one of name, num_replicas")
            .unwrap();
        assert!(m.ends_with("did you mean `num_replicas`?"), "{m}");
        let far = unknown_field("unknown field `zzz`, expected one of name, num_replicas").unwrap();
        assert!(
            far.contains("known fields here: name, num_replicas"),
            "{far}"
        );
        let hint = unknown_field(
            "unknown field `route_prefix`, expected one of name, num_replicas, user_config",
        )
        .unwrap();
        assert!(
            hint.contains("set route_prefix on the application"),
            "{hint}"
        );
        assert_eq!(unknown_field("invalid type: string"), None);
        // A name with a backtick is named whole.
        let tick = unknown_field("unknown field `max`x`, expected one of name").unwrap();
        assert!(tick.starts_with("unknown field `max`x`"), "{tick}");
        // A name far longer than any field is no typo: nothing is compared,
        // even with a known name one edit away (the cap says no, not the
        // distance).
        let (known, typo) = ("k".repeat(65), format!("{}x", "k".repeat(64)));
        assert_eq!(nearest(&typo, &[known.as_str()]), None);
        let (known, typo) = ("k".repeat(64), format!("{}x", "k".repeat(63)));
        assert_eq!(nearest(&typo, &[known.as_str()]), Some(known.as_str()));
        let long = "a".repeat(1_000_000);
        let m = unknown_field(&format!("unknown field `{long}`, expected one of name")).unwrap();
        assert!(
            m.contains("known fields here: name"),
            "{}",
            &m[m.len() - 40..]
        );
        assert_eq!(
            nearest("improt_path", &["import_path", "args"]),
            Some("import_path")
        );
    }
}
