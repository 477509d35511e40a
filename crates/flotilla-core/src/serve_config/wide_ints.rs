//! Integers a config writes that do not fit in 64 bits: serde-saphyr hands
//! such a literal to a free-form value (`args`, `user_config`) as a float,
//! which would change it without a word (PyYAML keeps it exact), so it is
//! refused, at its position.

use granit_parser::{Event, Parser, ScalarStyle};

use crate::error::Error;

/// Digits in a row below which no decimal integer is too wide: `i64::MIN`
/// and `u64::MAX` have 19 and 20.
const WIDE: usize = 19;

/// The first plain integer in `text` too wide for 64 bits, as an error at its
/// position. Texts without 19 digits in a row (nearly all) are not parsed
/// again.
pub(super) fn too_wide(text: &str) -> Option<Error> {
    if !has_digit_run(text, WIDE) {
        return None;
    }
    for event in Parser::new_from_str(text) {
        // The first parse succeeded; this one fails no sooner.
        let Ok((Event::Scalar(value, ScalarStyle::Plain, _, None), span)) = event else {
            continue;
        };
        if is_wide_integer(&value) {
            return Some(Error::Parse {
                line: span.start.line() as u64,
                column: span.start.col() as u64 + 1,
                message: format!(
                    "the integer {value} does not fit in 64 bits; quote it to keep it as text"
                ),
            });
        }
    }
    None
}

fn has_digit_run(text: &str, n: usize) -> bool {
    let mut run = 0;
    text.bytes().any(|b| {
        run = if b.is_ascii_digit() { run + 1 } else { 0 };
        run >= n
    })
}

/// A decimal integer literal (an optional sign, then digits) that neither
/// `i64` nor `u64` holds.
fn is_wide_integer(s: &str) -> bool {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && s.parse::<i64>().is_err()
        && s.parse::<u64>().is_err()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::ServeConfig;

    fn config(args: &str) -> String {
        format!("applications:\n  - name: a\n    import_path: x:y\n    args: {args}\n")
    }

    #[test]
    fn an_integer_too_wide_for_64_bits_is_refused_at_its_place() {
        for wide in [
            "123456789012345678901234567890",
            "18446744073709551616",
            "-9223372036854775809",
        ] {
            let e = ServeConfig::from_yaml(&config(&format!("{{n: {wide}}}"))).unwrap_err();
            match e {
                Error::Parse {
                    line: 4,
                    column: 15,
                    ref message,
                } if message.contains(wide) && message.contains("64 bits") => {}
                other => panic!("{wide}: {other:?}"),
            }
        }
    }

    #[test]
    fn integers_that_fit_and_text_that_looks_like_one_are_kept() {
        for (args, expect) in [
            ("{n: 18446744073709551615}", "18446744073709551615"),
            ("{n: -9223372036854775808}", "-9223372036854775808"),
            (
                "{n: '123456789012345678901234567890'}",
                "\"123456789012345678901234567890\"",
            ),
            ("{n: 1.0e+30}", "1e+30"),
        ] {
            let c = ServeConfig::from_yaml(&config(args)).unwrap();
            let v: serde_json::Value = c.applications[0].args.decode().unwrap();
            assert_eq!(v["n"].to_string(), expect, "{args}");
        }
        // Nor are digits in a comment or a block of text.
        let text = "applications:\n  - name: a\n    import_path: x:y\n    \
                    # 123456789012345678901234567890\n    args:\n      note: |\n        \
                    123456789012345678901234567890\n";
        let c = ServeConfig::from_yaml(text).unwrap();
        let v: serde_json::Value = c.applications[0].args.decode().unwrap();
        assert_eq!(v["note"], "123456789012345678901234567890\n");
    }
}
