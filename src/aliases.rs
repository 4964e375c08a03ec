//! Model names clients insist on (`models[].aliases`): agent CLIs send their
//! vendors' names (`claude-...`, `gpt-...`), and an alias says once which
//! served model they mean. A configured model's own name always wins; then
//! exact aliases; then globs, in the order of the configuration.

use std::collections::HashMap;

use crate::config::ModelConfig;

/// A name a client asked for, resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Alias<'a> {
    /// The model that serves it.
    pub served: &'a str,
    /// The configured alias it matched (the metric label: a glob, not the
    /// client's name, so the series stay few).
    pub pattern: &'a str,
}

/// Every model's aliases.
#[derive(Debug, Default)]
pub struct Aliases {
    exact: HashMap<String, String>,
    /// (pattern, served), in configuration order.
    globs: Vec<(String, String)>,
}

impl Aliases {
    pub fn new(models: &[ModelConfig]) -> Self {
        let mut aliases = Aliases::default();
        for m in models {
            for pattern in &m.aliases {
                match pattern.contains('*') {
                    true => aliases.globs.push((pattern.clone(), m.name.clone())),
                    false => {
                        aliases.exact.insert(pattern.clone(), m.name.clone());
                    }
                }
            }
        }
        aliases
    }

    /// The model `asked` means, if an alias names it.
    pub fn resolve(&self, asked: &str) -> Option<Alias<'_>> {
        if let Some((pattern, served)) = self.exact.get_key_value(asked) {
            return Some(Alias { served, pattern });
        }
        let (pattern, served) = self.globs.iter().find(|(p, _)| matches(p, asked))?;
        Some(Alias { served, pattern })
    }
}

/// Whether `name` matches `pattern`, in which `*` stands for any run of
/// characters (none included).
pub fn matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let mut parts: Vec<&str> = parts.collect();
    let Some(last) = parts.pop() else {
        return rest.is_empty(); // no `*`: the whole name
    };
    for part in parts {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_any_run_of_characters() {
        for (pattern, name) in [
            ("claude-*", "claude-sonnet-4-5"),
            ("claude-*", "claude-"),
            ("*", "anything"),
            ("gpt-*-mini", "gpt-4o-mini"),
            ("*sonnet*", "claude-sonnet-4"),
            ("a*b*c", "abc"),
            ("exact", "exact"),
        ] {
            assert!(matches(pattern, name), "{pattern} ~ {name}");
        }
        for (pattern, name) in [
            ("claude-*", "claude"),
            ("claude-*", "xclaude-1"),
            ("gpt-*-mini", "gpt-4o"),
            ("a*b*c", "acb"),
            ("ab*ba", "aba"),
            ("exact", "exactly"),
        ] {
            assert!(!matches(pattern, name), "{pattern} !~ {name}");
        }
    }

    #[test]
    fn exact_aliases_win_over_globs_and_globs_go_in_order() {
        let aliases = Aliases {
            exact: HashMap::from([("claude-haiku".into(), "small".into())]),
            globs: vec![
                ("claude-*".into(), "big".into()),
                ("*".into(), "catch-all".into()),
            ],
        };
        let resolved = |asked| aliases.resolve(asked).map(|a| (a.served, a.pattern));
        assert_eq!(resolved("claude-haiku"), Some(("small", "claude-haiku")));
        assert_eq!(resolved("claude-opus"), Some(("big", "claude-*")));
        assert_eq!(resolved("gpt-5"), Some(("catch-all", "*")));
        assert_eq!(Aliases::default().resolve("claude-opus"), None);
    }
}
